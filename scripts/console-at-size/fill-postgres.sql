-- Fills a migrated default-layout table (idem migrate) with the console's
-- at-size data set: :rows records (10,000,000 by default) of random UUIDv4
-- message IDs across six consumers, their recovery points, and an outbox.
-- Run on a private server, never on one that holds real data: it drops and
-- rebuilds the table's indexes around the load, and deletes every row.
--
--   psql "$URL" -v rows=10000000 -f scripts/console-at-size/fill-postgres.sql
--
-- The mix (docs/console.md, "At size"):
-- - payments 40%, mail 25% (lease mode: state 2), receipts 15%, shipping
--   10%, audit 8%, webhooks 2% (transactional mode: state NULL);
--   processed_at spread evenly over the past 7 days in insertion order (the
--   heap follows time, as an append-mostly table does);
-- - failed for good (state 3): 1 in 2,048 of payments and mail (about
--   3,200 at 10M), 6 error texts; poison (attempt 5) for half of them;
-- - leases in progress (state 1): 1 in 4,096 of payments and mail, their
--   leases expired long ago (stuck), plus 500 live leases of payments in the
--   last minute;
-- - recovery points: 2 steps for 1 in 20 of payments;
-- - outbox: rows/10 rows, 90% sent, 9.5% pending (the backlog), 0.5%
--   failed for good with 5 error texts.
\set ON_ERROR_STOP on
\if :{?rows}
\else
\set rows 10000000
\endif
SET synchronous_commit = off;
SET maintenance_work_mem = '512MB';
TRUNCATE idem_processed, idem_processed_steps, idem_processed_outbox;
-- Schema v2: each record refers to its consumer by key.
-- Keys are smallint, given in order (the largest plus one).
INSERT INTO idem_processed_consumers (key, name)
SELECT (SELECT COALESCE(max(key), 0) FROM idem_processed_consumers) + row_number() OVER (), v.n
FROM (VALUES ('payments'), ('mail'), ('receipts'), ('shipping'), ('audit'), ('webhooks')) AS v(n)
WHERE NOT EXISTS (SELECT FROM idem_processed_consumers c WHERE c.name = v.n);
ALTER TABLE idem_processed DROP CONSTRAINT IF EXISTS idem_processed_pkey;
DROP INDEX IF EXISTS idem_processed_processed_at_idx;
INSERT INTO idem_processed (consumer_key, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error, updated_at)
SELECT (SELECT key FROM idem_processed_consumers WHERE name = c), gen_random_uuid()::text, decode(md5(i::text) || md5((-i)::text), 'hex'), at,
       CASE WHEN NOT lease THEN NULL WHEN failed THEN 3 WHEN held THEN 1 ELSE 2 END,
       CASE WHEN lease THEN 1 + (i % 3) END,
       CASE WHEN NOT lease THEN NULL WHEN failed AND i % 2 = 0 THEN 5 ELSE 1 END,
       CASE WHEN lease AND held AND NOT failed THEN at + interval '30 seconds' END,
       CASE WHEN lease AND failed THEN (ARRAY['charge declined: insufficient funds', 'upstream 503 Service Unavailable', 'poison: 5 attempts failed',
                                             'invalid currency code', 'template not found', 'context deadline exceeded'])[1 + i % 6] END,
       at
FROM (
  SELECT i,
         CASE WHEN r < 40 THEN 'payments' WHEN r < 65 THEN 'mail' WHEN r < 80 THEN 'receipts'
              WHEN r < 90 THEN 'shipping' WHEN r < 98 THEN 'audit' ELSE 'webhooks' END AS c,
         r < 65 AS lease, (h & 4095) < 2 AS failed, (h >> 12 & 8191) < 2 AS held,
         now() - interval '7 days' + (interval '7 days' - interval '2 minutes') * (i::float8 / :rows) AS at
  FROM (SELECT i, (i * 7919) % 100 AS r, hashint8(i) AS h FROM generate_series(1::bigint, :rows) AS i) g
) s;
-- Live leases: recent attempts still holding theirs.
INSERT INTO idem_processed (consumer_key, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, updated_at)
SELECT (SELECT key FROM idem_processed_consumers WHERE name = 'payments'), gen_random_uuid()::text, decode(md5(i::text), 'hex'), now() - interval '1 second' * (i % 60), 1, 1, 1,
       now() + interval '10 minutes', now()
FROM generate_series(1, 500) AS i;
ALTER TABLE idem_processed ADD CONSTRAINT idem_processed_pkey PRIMARY KEY (consumer_key, message_id);
CREATE INDEX idem_processed_processed_at_idx ON idem_processed (consumer_key, processed_at);
INSERT INTO idem_processed_steps (consumer, message_id, step, result, created_at)
SELECT c.name, p.message_id, s.step, decode(md5(p.message_id || s.step), 'hex'), p.processed_at
FROM idem_processed p JOIN idem_processed_consumers c ON c.key = p.consumer_key CROSS JOIN (VALUES ('charge'), ('receipt')) AS s (step)
WHERE c.name = 'payments' AND hashtext(p.message_id) % 20 = 0;
INSERT INTO idem_processed_outbox (id, consumer, source_id, destination, order_key, payload, headers, created_at, available_at, attempts, last_error, sent_at, failed_at)
SELECT gen_random_uuid()::text, 'payments', gen_random_uuid()::text, 'payments.charged', CASE WHEN i % 3 = 0 THEN 'acct-' || (i % 1000) ELSE '' END,
       convert_to('{"amount":' || i || '}', 'UTF8'), '{"content-type":"application/json"}', at, at,
       CASE WHEN k < 900 THEN 1 WHEN k < 995 THEN 0 ELSE 3 END,
       CASE WHEN k >= 995 THEN (ARRAY['broker: no route to payments.charged', 'message too large', 'permission denied', 'schema rejected', 'topic deleted'])[1 + i % 5] END,
       CASE WHEN k < 900 THEN at + interval '50 milliseconds' END,
       CASE WHEN k >= 995 THEN at + interval '1 second' END
FROM (
  SELECT i, (i * 7919) % 1000 AS k,
         now() - interval '7 days' + interval '7 days' * (i::float8 / (:rows / 10)) AS at
  FROM generate_series(1::bigint, :rows / 10) AS i
) o;
VACUUM ANALYZE idem_processed;
VACUUM ANALYZE idem_processed_steps;
VACUUM ANALYZE idem_processed_outbox;
SELECT COALESCE(state::text, 'null') AS state, count(*) FROM idem_processed GROUP BY 1 ORDER BY 1;
SELECT pg_size_pretty(pg_total_relation_size('idem_processed')) AS processed, pg_size_pretty(pg_total_relation_size('idem_processed_outbox')) AS outbox;
