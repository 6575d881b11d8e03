-- Transactional records without lease-mode values: state, token and
-- attempt become nullable without a default, so that a transactional
-- claim, which inserts only consumer, message_id, fingerprint and
-- processed_at, stores NULLs (three bits of the row's null bitmap)
-- instead of 13 bytes, in each record and in the redo log of each new
-- message. Every statement reads a NULL state as completed (2), a NULL
-- token as 0 and a NULL attempt as 1: what a transactional record is,
-- and what the rows written before this migration hold, which keep their
-- values. Lease-mode writes set all three explicitly.
--
-- NOT NULL to NULL rebuilds the table on MariaDB (instant only for
-- ROW_FORMAT=REDUNDANT) and on MySQL. ALGORITHM=INPLACE, LOCK=NONE
-- rebuilds it online: reads and writes go on throughout, the metadata
-- lock is held exclusively only for a moment at the start and at the end.
-- For each of those moments the ALTER waits until every transaction that
-- has used the table ends, and every new statement on the table queues
-- behind it meanwhile. The migration runner bounds that wait: it runs the
-- migrations with the session's lock_wait_timeout at 1 second (not the
-- server's, a day on MariaDB, a year on MySQL), so the ALTER gives way
-- after a second (error 1205, ER_LOCK_WAIT_TIMEOUT, also MariaDB's for a
-- metadata lock) and the runner runs it again after a pause (100 ms,
-- doubling up to 5 s) until it gets the lock or the caller's context
-- ends. A try that gives way at the end throws its rebuild away.
-- Measured on MariaDB 10.11 (a 2-core machine shared with other load, two
-- runs): a table of 1,000,000 records took 6 s at a load of 6 and 14 s at
-- a load of 13, while a writer that inserted one record per transaction
-- throughout went on (p99 11 and 60 ms) and waited at most 0.15 and
-- 0.75 s for one insert, at the end of the rebuild. The changes made meanwhile are kept in a log
-- of at most innodb_online_alter_log_max_size bytes (128 MiB by default);
-- past it the ALTER fails, changing nothing, and Migrate can run again.
--
-- Upgrade order: deploy a version of idem that reads these NULLs first,
-- then migrate. A binary from before it still claims and
-- detects duplicates beside the migrated table (its inserts store NULLs
-- too), but fails to read a transactional record written after the
-- migration in Inspect and in a lease-mode Acquire of the same message
-- (NULL into an integer), and its purge skips such records (state <> 1
-- is not true of NULL) until a newer binary purges them.
--
-- MySQL commits DDL statement by statement, so this migration is written
-- to be re-run after a failure halfway (before its version was recorded):
-- one ALTER TABLE, which InnoDB applies whole or not at all, run only
-- while information_schema shows one of the three columns NOT NULL.
SET @idem_ddl = IF(
    (SELECT COUNT(*) FROM information_schema.COLUMNS
     WHERE TABLE_SCHEMA = IF(LOCATE('.', '{{.Table}}') > 0, SUBSTRING_INDEX('{{.Table}}', '.', 1), DATABASE())
       AND TABLE_NAME = '{{.Name}}' AND COLUMN_NAME IN ('state', 'token', 'attempt') AND IS_NULLABLE = 'NO') = 0,
    'DO 0',
    'ALTER TABLE {{.Table}}
    MODIFY COLUMN state   TINYINT UNSIGNED NULL DEFAULT NULL,
    MODIFY COLUMN token   BIGINT           NULL DEFAULT NULL,
    MODIFY COLUMN attempt INT              NULL DEFAULT NULL,
    ALGORITHM=INPLACE, LOCK=NONE');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
SET @idem_ddl = NULL;
