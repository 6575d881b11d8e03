-- idem:no-transaction unless-small {{.Table}}_outbox
-- The failed rows' index holds their ID after failed_at, in the order the
-- operator lists them (idem failed --outbox, the console's outbox page:
-- newest failure first, then by ID), so a page is read by one index scan
-- under its limit. On failed_at alone, PostgreSQL read and sorted every
-- failed row older than the page to return its 50 (5,000 rows, 5,000
-- buffers a page, with 1,000,000 outbox rows of which 0.5% failed;
-- docs/console.md, "At size"). Its predicate is the operator's (failed
-- and not sent), so the count of failed rows (the backlog) is an index-only
-- scan; the relay's purge of failed rows (sent_at IS NULL AND failed_at <
-- ...) implies it and uses it as it used the old index. A row gets an
-- entry only when it fails for good.
--
-- Built without blocking the outbox's writers (CREATE INDEX CONCURRENTLY,
-- as 011_outbox_key_hash.sql explains); on an outbox of fewer than 10,000
-- rows, in the migration's transaction. A build that failed part way
-- leaves an invalid index behind: the first statement drops it, so the
-- migration can run again. The old index is dropped once the new one is
-- valid.
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_outbox_failed;
CREATE INDEX CONCURRENTLY {{.Name}}_outbox_failed ON {{.Table}}_outbox (failed_at, id) WHERE failed_at IS NOT NULL AND sent_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_outbox_fail;
