-- The write cost of the failed records' partial index (migration 012): WAL bytes a
-- message of 20,000 lease records acquired then completed, on a copy of
-- the default layout's table without it (wal_a) and with it (wal_b), twice
-- each. Run on a private server after idem migrate (it reads idem_processed's
-- columns):
--
--   psql "$URL" -f scripts/console-at-size/wal-failed-index.sql
\set ON_ERROR_STOP on
SET synchronous_commit = off;
DROP TABLE IF EXISTS wal_a, wal_b;
CREATE TABLE wal_a (LIKE idem_processed INCLUDING DEFAULTS);
ALTER TABLE wal_a ADD PRIMARY KEY (consumer, message_id);
CREATE INDEX ON wal_a (consumer, processed_at);
CREATE TABLE wal_b (LIKE wal_a INCLUDING ALL);
CREATE INDEX ON wal_b (consumer, processed_at, message_id) WHERE state = 3;
CREATE TEMP TABLE r (t text, phase text, bytes numeric);
-- each: 20,000 lease records acquired (state 1), then completed (state 2, processed_at = now()); 1 in 2,000 failed for good instead
DO $$ DECLARE t text; l0 pg_lsn; BEGIN
FOREACH t IN ARRAY ARRAY['wal_a', 'wal_b', 'wal_a', 'wal_b'] LOOP
  EXECUTE format('TRUNCATE %I', t);
  l0 := pg_current_wal_insert_lsn();
  FOR i IN 1..20000 LOOP
    EXECUTE format('INSERT INTO %I (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, updated_at) VALUES ($1, $2, $3, now(), 1, 1, 1, now() + interval ''30 s'', now())', t)
      USING 'payments', gen_random_uuid()::text, '\x0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20'::bytea;
  END LOOP;
  INSERT INTO r VALUES (t, 'acquire', pg_current_wal_insert_lsn() - l0);
  l0 := pg_current_wal_insert_lsn();
  EXECUTE format('UPDATE %I SET state = CASE WHEN hashtext(message_id) %% 2000 = 0 THEN 3 ELSE 2 END, processed_at = now(), lease_expires_at = now(), updated_at = now(), last_error = CASE WHEN hashtext(message_id) %% 2000 = 0 THEN ''boom'' END', t);
  INSERT INTO r VALUES (t, 'complete', pg_current_wal_insert_lsn() - l0);
END LOOP; END $$;
SELECT t, phase, round(bytes / 20000, 1) AS wal_bytes_per_msg FROM r ORDER BY phase, t;
SELECT t, count(*) FILTER (WHERE state = 3) AS failed FROM (SELECT 'wal_a' t, state FROM wal_a UNION ALL SELECT 'wal_b', state FROM wal_b) x GROUP BY t;
DROP TABLE wal_a, wal_b;
