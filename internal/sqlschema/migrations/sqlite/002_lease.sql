-- Lease mode (idem.LeaseStore): each record's state, fencing token, attempt
-- count, lease expiry (Unix microseconds from SQLite's clock, like
-- processed_at), stored result and last error, and a table of recovery
-- points (completed steps of multi-step handlers).
--
-- Every new column has a constant default or is NULL, so the rows already
-- there become completed records (what a transactional-mode record is) and
-- transactional claims, which insert only consumer, message_id, fingerprint
-- and processed_at, keep working unchanged. The migration runs in one
-- transaction.
--
-- state: 1 in_progress, 2 completed, 3 failed (idem.RecordState).
-- token: the fencing token of the attempt that owns an in_progress record
-- (0 for a transactional record). A release moves it on by one.
-- lease_expires_at, updated_at: NULL for transactional records.
-- result: NULL for transactional records.
ALTER TABLE {{.Table}} ADD COLUMN state INTEGER NOT NULL DEFAULT 2 CHECK (state BETWEEN 1 AND 3);
ALTER TABLE {{.Table}} ADD COLUMN token INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Table}} ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE {{.Table}} ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE {{.Table}} ADD COLUMN result BLOB;
ALTER TABLE {{.Table}} ADD COLUMN content_type TEXT;
ALTER TABLE {{.Table}} ADD COLUMN last_error TEXT;
ALTER TABLE {{.Table}} ADD COLUMN updated_at INTEGER;
-- Recovery points: one row per completed step of a message, written only
-- by the attempt that owns the record, deleted with the record by Purge.
CREATE TABLE IF NOT EXISTS {{.Table}}_steps (
    consumer   TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    step       TEXT    NOT NULL,
    result     BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id, step)
);
