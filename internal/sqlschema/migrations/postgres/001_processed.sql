-- The processed-messages table (the inbox): one row per (consumer, message ID).
-- IDs are text with the "C" collation: compared byte for byte, whatever the
-- database's default collation is.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     text COLLATE "C" NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    message_id   text COLLATE "C" NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
    fingerprint  bytea NOT NULL CHECK (octet_length(fingerprint) BETWEEN 1 AND 64),
    processed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{.Name}}_pkey PRIMARY KEY (consumer, message_id)
);
-- Retention: purge scans one consumer's oldest rows; the newest row gives
-- the downtime-safe horizon.
CREATE INDEX IF NOT EXISTS {{.Name}}_processed_at_idx ON {{.Table}} (consumer, processed_at);
