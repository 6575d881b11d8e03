-- The outbox: messages a handler emitted in its transaction (or that any
-- program wrote in its own transaction), sent by the relay after commit.
-- The schema is documented in docs/outbox.md and kept stable, since
-- programs in other languages write rows into it.
--
-- id: the outgoing message ID. seq: the emission order; per destination
-- and non-empty order_key, rows are sent in seq order. A row is pending
-- while sent_at and failed_at are NULL. Times are Unix microseconds from
-- SQLite's clock. headers is a JSON object of strings. SQLite has one
-- writer at a time, so a relay's claim (one UPDATE) needs no row locks;
-- lease_until keeps other relays off the rows it claimed.
CREATE TABLE IF NOT EXISTS {{.Table}}_outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE,
    consumer     TEXT    NOT NULL DEFAULT '',
    source_id    TEXT    NOT NULL DEFAULT '',
    destination  TEXT    NOT NULL,
    order_key    TEXT    NOT NULL DEFAULT '',
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL DEFAULT '{}',
    created_at   INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000),
    available_at INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000),
    lease_until  INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    sent_at      INTEGER,
    failed_at    INTEGER
);
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_pend ON {{.Table}}_outbox (seq) WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_key ON {{.Table}}_outbox (destination, order_key, seq) WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_sent ON {{.Table}}_outbox (sent_at) WHERE sent_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_fail ON {{.Table}}_outbox (failed_at) WHERE failed_at IS NOT NULL;
