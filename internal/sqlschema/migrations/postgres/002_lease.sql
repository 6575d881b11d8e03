-- Lease mode (idem.LeaseStore): each record's state, fencing token, attempt
-- count, lease expiry (the server's clock), stored result and last error,
-- and a table of recovery points (completed steps of multi-step handlers).
--
-- Every new column has a constant default or is NULL, so the rows already
-- there become completed records (what a transactional-mode record is) and
-- transactional claims, which insert only consumer, message_id and
-- fingerprint, keep working unchanged. PostgreSQL 11 and later add such
-- columns without rewriting the table, and the CHECK is NOT VALID so that
-- adding it scans nothing (every existing row holds the default, 2). New
-- rows are checked.
--
-- state: 1 in_progress, 2 completed, 3 failed (idem.RecordState).
-- token: the fencing token of the attempt that owns an in_progress record
-- (0 for a transactional record). A release moves it on by one, so the
-- released attempt owns nothing.
-- lease_expires_at, updated_at: NULL for transactional records.
-- result: NULL for transactional records, the stored bytes (maybe empty)
-- for lease-mode completions.
ALTER TABLE {{.Table}}
    ADD COLUMN IF NOT EXISTS state            smallint NOT NULL DEFAULT 2,
    ADD COLUMN IF NOT EXISTS token            bigint   NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS attempt          integer  NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS lease_expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS result           bytea,
    ADD COLUMN IF NOT EXISTS content_type     text,
    ADD COLUMN IF NOT EXISTS last_error       text,
    ADD COLUMN IF NOT EXISTS updated_at       timestamptz,
    ADD CONSTRAINT {{.Name}}_state_check CHECK (state BETWEEN 1 AND 3) NOT VALID;
-- Recovery points: one row per completed step of a message, written only
-- by the attempt that owns the record, deleted with the record by Purge.
CREATE TABLE IF NOT EXISTS {{.Table}}_steps (
    consumer   text COLLATE "C" NOT NULL,
    message_id text COLLATE "C" NOT NULL,
    step       text COLLATE "C" NOT NULL CHECK (octet_length(step) BETWEEN 1 AND 255),
    result     bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{.Name}}_steps_pkey PRIMARY KEY (consumer, message_id, step)
);
