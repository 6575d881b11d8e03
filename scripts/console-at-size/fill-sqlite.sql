-- The SQLite counterpart of fill-postgres.sql (the same mix, at 1,000,000
-- records by default: change the 1000000 below), for a file migrated by
-- idem migrate --store sqlite:PATH. Deletes every row first.
--
--   sqlite3 PATH < scripts/console-at-size/fill-sqlite.sql
--
-- Times are microseconds since the epoch; the records span the past 7
-- days; message IDs are random (UUIDv4-shaped hex).
PRAGMA journal_mode = WAL;
PRAGMA synchronous = OFF;
BEGIN;
DELETE FROM idem_processed;
DELETE FROM idem_processed_steps;
DELETE FROM idem_processed_outbox;
CREATE TEMP TABLE params AS SELECT 1000000 AS n, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER) AS now_us, 7 * 86400000000 AS span;
WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g, params WHERE i < params.n),
s AS (
  SELECT i, (i * 7919) % 100 AS r, abs(random()) AS h,
         (SELECT now_us - span + (span - 120000000) * i / n FROM params) AS at
  FROM g
)
INSERT INTO idem_processed (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error, updated_at)
SELECT CASE WHEN r < 40 THEN 'payments' WHEN r < 65 THEN 'mail' WHEN r < 80 THEN 'receipts'
            WHEN r < 90 THEN 'shipping' WHEN r < 98 THEN 'audit' ELSE 'webhooks' END,
       lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(2)) || '-' || hex(randomblob(6))),
       randomblob(32), at,
       CASE WHEN r >= 65 THEN 2 WHEN h % 2048 < 1 THEN 3 WHEN (h / 2048) % 4096 < 1 THEN 1 ELSE 2 END,
       CASE WHEN r < 65 THEN 1 + i % 3 ELSE 0 END,
       CASE WHEN r < 65 AND h % 2048 < 1 AND i % 2 = 0 THEN 5 ELSE 1 END,
       CASE WHEN r < 65 AND h % 2048 >= 1 AND (h / 2048) % 4096 < 1 THEN at + 30000000 END,
       CASE WHEN r < 65 AND h % 2048 < 1 THEN CASE i % 6 WHEN 0 THEN 'charge declined: insufficient funds' WHEN 1 THEN 'upstream 503 Service Unavailable'
            WHEN 2 THEN 'poison: 5 attempts failed' WHEN 3 THEN 'invalid currency code' WHEN 4 THEN 'template not found' ELSE 'context deadline exceeded' END END,
       at
FROM s;
INSERT INTO idem_processed_steps (consumer, message_id, step, result, created_at)
SELECT p.consumer, p.message_id, st.step, randomblob(16), p.processed_at
FROM idem_processed p, (SELECT 'charge' AS step UNION ALL SELECT 'receipt') st
WHERE p.consumer = 'payments' AND p.rowid % 20 = 0;
WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g, params WHERE i < params.n / 10),
o AS (SELECT i, (i * 7919) % 1000 AS k, (SELECT now_us - span + span * i / (n / 10) FROM params) AS at FROM g)
INSERT INTO idem_processed_outbox (id, consumer, source_id, destination, order_key, payload, headers, created_at, available_at, attempts, last_error, sent_at, failed_at)
SELECT lower(hex(randomblob(16))), 'payments', lower(hex(randomblob(16))), 'payments.charged', CASE WHEN i % 3 = 0 THEN 'acct-' || (i % 1000) ELSE '' END,
       CAST('{"amount":' || i || '}' AS BLOB), '{"content-type":"application/json"}', at, at,
       CASE WHEN k < 900 THEN 1 WHEN k < 995 THEN 0 ELSE 3 END,
       CASE WHEN k >= 995 THEN CASE i % 5 WHEN 0 THEN 'broker: no route to payments.charged' WHEN 1 THEN 'message too large' WHEN 2 THEN 'permission denied'
            WHEN 3 THEN 'schema rejected' ELSE 'topic deleted' END END,
       CASE WHEN k < 900 THEN at + 50000 END,
       CASE WHEN k >= 995 THEN at + 1000000 END
FROM o;
COMMIT;
ANALYZE;
SELECT state, count(*) FROM idem_processed GROUP BY state;
