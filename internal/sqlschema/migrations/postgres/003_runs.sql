-- Runs: the spans of time in which a consumer was running, from its first
-- MarkRunning to its last (idemdriver.Retainer). Retention counts only
-- running time: a record is purged once its consumer has been running for
-- the retention window since the record was written, so a consumer that
-- was down for longer than the window still recognises the redeliveries
-- of its downtime. Times are the server's (now()), like processed_at.
-- Several processes of one consumer may add overlapping runs; the purge
-- merges them, and deletes the runs it no longer needs.
CREATE TABLE IF NOT EXISTS {{.Table}}_runs (
    consumer   text COLLATE "C" NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    started_at timestamptz NOT NULL,
    ended_at   timestamptz NOT NULL,
    CONSTRAINT {{.Name}}_runs_pkey PRIMARY KEY (consumer, started_at)
);
