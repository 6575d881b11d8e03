-- Runs: the spans of time in which a consumer was running, from its first
-- MarkRunning to its last (idemdriver.Retainer). Retention counts only
-- running time: a record is purged once its consumer has been running for
-- the retention window since the record was written, so a consumer that
-- was down for longer than the window still recognises the redeliveries
-- of its downtime. Times are Unix microseconds from SQLite's clock, like
-- processed_at. Several processes of one consumer may add overlapping
-- runs; the purge merges them, and deletes the runs it no longer needs.
CREATE TABLE IF NOT EXISTS {{.Table}}_runs (
    consumer   TEXT    NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at   INTEGER NOT NULL,
    PRIMARY KEY (consumer, started_at)
);
