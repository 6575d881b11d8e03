-- Runs: the spans of time in which a consumer was running, from its first
-- MarkRunning to its last (idemdriver.Retainer). Retention counts only
-- running time: a record is purged once its consumer has been running for
-- the retention window since the record was written, so a consumer that
-- was down for longer than the window still recognises the redeliveries
-- of its downtime. Times are UTC DATETIME(6) written by the server
-- (UTC_TIMESTAMP(6)), like processed_at. Several processes of one consumer
-- may add overlapping runs; the purge merges them, and deletes the runs it
-- no longer needs. One statement, safe to re-run.
CREATE TABLE IF NOT EXISTS {{.Table}}_runs (
    consumer   VARBINARY(255) NOT NULL,
    started_at DATETIME(6)    NOT NULL,
    ended_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, started_at)
) ENGINE=InnoDB;
