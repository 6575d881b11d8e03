-- The processed-messages table (the inbox): one row per (consumer, message ID).
-- TEXT with SQLite's default BINARY collation compares byte for byte.
-- processed_at is Unix time in microseconds from SQLite's own clock.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    fingerprint  BLOB NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {{.Name}}_processed_at_idx ON {{.Table}} (consumer, processed_at);
