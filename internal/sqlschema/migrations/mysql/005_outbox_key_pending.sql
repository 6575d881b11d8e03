-- The relay's claim takes a pending row only when no earlier pending row
-- has the same destination and ordering key. On the index of 004,
-- (destination, order_key, seq), that check stepped through every
-- earlier row of the key, sent ones included (kept for the relay's
-- retention, 24 hours by default), and read each row to test sent_at: a
-- claim of 50 rows took 0.4-0.8 s with 10,000 sent rows kept per key and
-- 2.4-3.9 s with 50,000 (MariaDB 10.11), against milliseconds on
-- PostgreSQL, whose index holds pending rows only. MySQL has no partial
-- indexes; this one puts sent_at and failed_at before seq, so that the
-- check looks up (destination, order_key, NULL, NULL) and reads pending
-- rows only, from the index alone (a claim of 50 rows with 50,000 sent
-- rows kept: 1.8 s before, 15 ms after).
--
-- One ALTER TABLE adds it and drops the old index, which InnoDB applies
-- whole or not at all, run only when the table does not have it yet (MySQL
-- commits DDL statement by statement and has no CREATE INDEX IF NOT
-- EXISTS). InnoDB builds it in place, without blocking reads or writes.
SET @idem_ddl = IF(
    (SELECT COUNT(*) FROM information_schema.STATISTICS
     WHERE TABLE_SCHEMA = IF(LOCATE('.', '{{.Table}}') > 0, SUBSTRING_INDEX('{{.Table}}', '.', 1), DATABASE())
       AND TABLE_NAME = '{{.Name}}_outbox' AND INDEX_NAME = '{{.Name}}_outbox_kpend') > 0,
    'DO 0',
    'ALTER TABLE {{.Table}}_outbox
    ADD KEY {{.Name}}_outbox_kpend (destination, order_key, sent_at, failed_at, seq),
    DROP KEY {{.Name}}_outbox_key');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
SET @idem_ddl = NULL;
