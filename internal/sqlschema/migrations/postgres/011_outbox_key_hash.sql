-- idem:no-transaction unless-small {{.Table}}_outbox
-- The index of the relay's order check (is there an earlier pending row
-- of the same destination and ordering key?) holds a hash of the key
-- instead of the destination and the key themselves, and only the rows
-- that have a key (a row without one is never checked): 16 bytes a row
-- (hashtextextended(order_key, 0) and seq) instead of the two texts and
-- seq, so about four times as many entries on a page and fewer page
-- splits. The claim compares the hashes through the index and then the
-- destination and key of each row found, so two keys of one hash only
-- cost a row read. Measured on PostgreSQL 15 (the WAL of 7,000 rows each
-- inserted, claimed and deleted, by record): 72 bytes a row for the new
-- index's entries and 18 for its page splits, against 95 and 45 for the
-- old one; the pending-rows index on seq is unchanged.
--
-- Built without blocking the table's writers: CREATE INDEX CONCURRENTLY
-- takes a lock that blocks neither reads nor writes, waits for the
-- transactions that were writing the table when it started, reads the
-- table twice, and cannot run in a transaction block (idem migrate runs
-- this migration's statements each on its own, holding its migration lock
-- in another transaction). A build that failed part way leaves an invalid
-- index behind: the first statement drops it, so the migration can run
-- again. On an outbox of fewer than 10,000 rows (a new one, or a relay
-- that keeps up) the statements run in the migration's transaction
-- without CONCURRENTLY instead: the build then blocks the table's writers
-- for milliseconds, while a concurrent build waits for every transaction
-- of the database older than itself, whatever tables they use. The old key index is dropped concurrently too, once the new one
-- is valid; claims find the rows by either meanwhile.
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_outbox_khash;
CREATE INDEX CONCURRENTLY {{.Name}}_outbox_khash ON {{.Table}}_outbox (hashtextextended(order_key, 0), seq) WHERE COALESCE(sent_at, failed_at) IS NULL AND order_key <> '';
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_outbox_key_pending;
