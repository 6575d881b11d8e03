-- Lease mode (idem.LeaseStore): each record's state, fencing token, attempt
-- count, lease expiry (UTC, the server's clock), stored result and last
-- error, and a table of recovery points (completed steps of multi-step
-- handlers).
--
-- Every new column has a constant default or is NULL, so the rows already
-- there become completed records (what a transactional-mode record is) and
-- transactional claims, which insert only consumer, message_id, fingerprint
-- and processed_at, keep working unchanged. InnoDB adds such columns in
-- place (instantly on MariaDB 10.4+ and MySQL 8.0.29+).
--
-- MySQL commits DDL statement by statement, so this migration is written
-- to be re-run after a failure halfway (before its version was recorded):
-- the steps table IF NOT EXISTS, then every column in one ALTER TABLE,
-- which InnoDB applies whole or not at all, run only when the table has no
-- state column yet (MySQL has no ADD COLUMN IF NOT EXISTS, MariaDB has).
--
-- Binary types throughout, so that nothing depends on the connection's
-- character set: results are LONGBLOB (up to 4 GiB, bounded in practice by
-- max_allowed_packet), the content type at most 1024 bytes and the error
-- text at most 64 KiB (the store checks and bounds them). No CHECK on
-- state, whose addition would scan (or copy) the table.
--
-- state: 1 in_progress, 2 completed, 3 failed (idem.RecordState).
-- token: the fencing token of the attempt that owns an in_progress record
-- (0 for a transactional record). A release moves it on by one.
-- lease_expires_at, updated_at: NULL for transactional records.
-- result: NULL for transactional records.
CREATE TABLE IF NOT EXISTS {{.Table}}_steps (
    consumer   VARBINARY(255) NOT NULL,
    message_id VARBINARY(255) NOT NULL,
    step       VARBINARY(255) NOT NULL,
    result     LONGBLOB       NOT NULL,
    created_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, message_id, step)
) ENGINE=InnoDB;
SET @idem_ddl = IF(
    (SELECT COUNT(*) FROM information_schema.COLUMNS
     WHERE TABLE_SCHEMA = IF(LOCATE('.', '{{.Table}}') > 0, SUBSTRING_INDEX('{{.Table}}', '.', 1), DATABASE())
       AND TABLE_NAME = '{{.Name}}' AND COLUMN_NAME = 'state') > 0,
    'DO 0',
    'ALTER TABLE {{.Table}}
    ADD COLUMN state            TINYINT UNSIGNED NOT NULL DEFAULT 2,
    ADD COLUMN token            BIGINT           NOT NULL DEFAULT 0,
    ADD COLUMN attempt          INT              NOT NULL DEFAULT 1,
    ADD COLUMN lease_expires_at DATETIME(6)      NULL,
    ADD COLUMN result           LONGBLOB         NULL,
    ADD COLUMN content_type     VARBINARY(1024)  NULL,
    ADD COLUMN last_error       MEDIUMBLOB       NULL,
    ADD COLUMN updated_at       DATETIME(6)      NULL');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
SET @idem_ddl = NULL;
