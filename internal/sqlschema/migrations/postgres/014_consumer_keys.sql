-- idem:no-transaction unless-small {{.Table}}
-- Schema v2, first half (expand): each consumer name is stored once, in
-- the table {{.Table}}_consumers, and the processed table refers to it by
-- a 2-byte key, consumer_key (smallint), instead of repeating the name in
-- every row and in two of its indexes. A primary key entry is then that
-- of a hand-written table keyed by message ID alone (48 bytes with a
-- 36-character ID, 56 with any name of up to 13 bytes), and the statements
-- take the key as a parameter, found once per consumer and process by the
-- store. Keys are given in order (the largest plus one, no sequence: a
-- transaction that rolls back gives its key back), are never changed or
-- deleted, and number at most 32,767 per table. Migration 015 (contract)
-- then makes (consumer_key, message_id) the primary key and drops the
-- consumer column; this one only adds, while consumers of any version
-- keep running:
--
-- 1. the consumers table and the nullable column consumer_key (catalog
--    only);
-- 2. a trigger that fills consumer_key for each row inserted by a writer
--    that writes the name only (every binary, this one included, until
--    015 has run), adding the name to the consumers table on first use;
-- 3. the names already there into the consumers table (again until no
--    name is missing: a name whose key a writer's trigger took meanwhile
--    is added by the next run), and a backfill of consumer_key in batches
--    of 1,000 rows, each its own transaction, found through a partial
--    index of the rows still to fill (built concurrently, dropped at the
--    end);
-- 4. NOT NULL: a NOT VALID check, validated afterwards (a scan that
--    blocks no writer), after which SET NOT NULL needs no scan;
-- 5. the unique index (consumer_key, message_id) and the retention and
--    failed-records indexes on consumer_key, built concurrently.
--
-- A table of more than 32,767 consumer names is refused by the first
-- statement, before anything is changed (SQLSTATE 22003, "more than
-- 32767 consumer names"): its consumers keep running on schema v1. The
-- count reads the primary key's index in order and stops at the 32,768th
-- name.
--
-- Every statement that takes the table's exclusive lock (ADD COLUMN, the
-- trigger, ADD CONSTRAINT, SET NOT NULL) changes the catalog only and runs
-- with a lock_timeout of one second, again after a pause while it times
-- out, so no consumer's claim waits behind it for longer than that. The
-- index builds and the backfill block no writer. On a table of fewer than
-- 10,000 records (a new one) the statements run in the migration's
-- transaction instead, without CONCURRENTLY. Each statement can run again:
-- a migration that failed part way is run again from its start.
DO $$ BEGIN IF to_regclass('{{.Table}}_consumers') IS NULL AND (SELECT count(*) FROM (SELECT DISTINCT consumer FROM {{.Table}} LIMIT 32768) AS d) > 32767 THEN RAISE EXCEPTION 'idem: {{.Table}} holds more than 32767 consumer names; schema v2 keys them by a smallint and cannot take them' USING ERRCODE = '22003'; END IF; END $$;
CREATE TABLE IF NOT EXISTS {{.Table}}_consumers (key smallint NOT NULL, name text COLLATE "C" NOT NULL, CONSTRAINT {{.Name}}_consumers_pkey PRIMARY KEY (key), CONSTRAINT {{.Name}}_consumers_name_key UNIQUE (name));
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS consumer_key smallint;
CREATE OR REPLACE FUNCTION {{.Table}}_consumer_key() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.consumer_key IS NULL THEN FOR i IN 1..3 LOOP SELECT key INTO NEW.consumer_key FROM {{.Table}}_consumers WHERE name = NEW.consumer; EXIT WHEN FOUND; BEGIN INSERT INTO {{.Table}}_consumers (key, name) SELECT COALESCE(max(key), 0) + 1, NEW.consumer FROM {{.Table}}_consumers RETURNING key INTO NEW.consumer_key; EXIT; EXCEPTION WHEN unique_violation THEN NULL; END; END LOOP; IF NEW.consumer_key IS NULL THEN RAISE EXCEPTION 'consumer key of % not settled', NEW.consumer USING ERRCODE = '40001'; END IF; END IF; RETURN NEW; END $$;
CREATE OR REPLACE TRIGGER {{.Name}}_consumer_key BEFORE INSERT ON {{.Table}} FOR EACH ROW EXECUTE FUNCTION {{.Table}}_consumer_key();
/* idem:repeat */ INSERT INTO {{.Table}}_consumers (key, name) SELECT (SELECT COALESCE(max(key), 0) FROM {{.Table}}_consumers) + row_number() OVER (ORDER BY d.consumer), d.consumer FROM (SELECT DISTINCT consumer FROM {{.Table}}) AS d WHERE NOT EXISTS (SELECT FROM {{.Table}}_consumers c WHERE c.name = d.consumer) ON CONFLICT DO NOTHING;
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_consumer_key_todo;
CREATE INDEX CONCURRENTLY {{.Name}}_consumer_key_todo ON {{.Table}} (consumer, message_id) WHERE consumer_key IS NULL;
/* idem:repeat */ UPDATE {{.Table}} r SET consumer_key = c.key FROM {{.Table}}_consumers c WHERE c.name = r.consumer AND (r.consumer, r.message_id) IN (SELECT consumer, message_id FROM {{.Table}} WHERE consumer_key IS NULL LIMIT 1000 FOR UPDATE);
DO $$ BEGIN ALTER TABLE {{.Table}} ADD CONSTRAINT {{.Name}}_consumer_key_set CHECK (consumer_key IS NOT NULL) NOT VALID; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
ALTER TABLE {{.Table}} VALIDATE CONSTRAINT {{.Name}}_consumer_key_set;
ALTER TABLE {{.Table}} ALTER COLUMN consumer_key SET NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_consumer_key_todo;
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_by_key;
CREATE UNIQUE INDEX CONCURRENTLY {{.Name}}_by_key ON {{.Table}} (consumer_key, message_id);
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_processed_at_key_idx;
CREATE INDEX CONCURRENTLY {{.Name}}_processed_at_key_idx ON {{.Table}} (consumer_key, processed_at);
DROP INDEX CONCURRENTLY IF EXISTS {{.Table}}_failed_key_idx;
CREATE INDEX CONCURRENTLY {{.Name}}_failed_key_idx ON {{.Table}} (consumer_key, processed_at, message_id) WHERE state = 3;
