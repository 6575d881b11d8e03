-- The outbox's byte-length checks move from the table to two domains.
-- PostgreSQL reads and plans a table's CHECK expressions anew for every
-- statement that inserts or updates it: the outbox's five cost each
-- emitting INSERT about 28 microseconds of server CPU (a third of the
-- INSERT's executor time, measured by perf), and each relay claim and
-- mark as much again. A domain's checks are compiled once per connection
-- and kept. The bounds stay in the database, for programs in other
-- languages that write rows: id and destination take 1..255 bytes
-- (<table>_outbox_id), consumer, source_id and order_key at most 255
-- (<table>_outbox_str); a violation is still SQLSTATE 23514
-- (check_violation). The domains are text with the "C" collation, as
-- the columns were, so the table is not rewritten and its primary key is
-- kept: the domains get their checks only after the columns change type,
-- NOT VALID (the existing rows met the same checks), and the table's are
-- dropped first (a check on a column whose type changes would be checked
-- again against every row). PostgreSQL rebuilds a partial index on a
-- column whose type changes: the key index on (destination, order_key,
-- seq), which holds the pending rows only, but whose build reads the
-- whole table (sent rows are kept for the relay's retention, 24 hours by
-- default). The ALTER TABLE holds the table's exclusive lock meanwhile:
-- emitting transactions and relays wait for it. Like the domains, their
-- checks are added only where they are missing, so that the migrations
-- run again over an outbox whose processed table and migrations record
-- were dropped (its domains are left behind) complete.
DO $$ BEGIN CREATE DOMAIN {{.Table}}_outbox_id AS text COLLATE "C"; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ BEGIN CREATE DOMAIN {{.Table}}_outbox_str AS text COLLATE "C"; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ DECLARE r record; BEGIN FOR r IN SELECT c.conname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] WHERE c.conrelid = '{{.Table}}_outbox'::regclass AND c.contype = 'c' AND cardinality(c.conkey) = 1 AND a.attname IN ('id', 'consumer', 'source_id', 'destination', 'order_key') LOOP EXECUTE format('ALTER TABLE {{.Table}}_outbox DROP CONSTRAINT IF EXISTS %I', r.conname); END LOOP; END $$;
ALTER TABLE {{.Table}}_outbox
    ALTER COLUMN id TYPE {{.Table}}_outbox_id,
    ALTER COLUMN destination TYPE {{.Table}}_outbox_id,
    ALTER COLUMN consumer TYPE {{.Table}}_outbox_str,
    ALTER COLUMN source_id TYPE {{.Table}}_outbox_str,
    ALTER COLUMN order_key TYPE {{.Table}}_outbox_str;
DO $$ BEGIN ALTER DOMAIN {{.Table}}_outbox_id ADD CONSTRAINT {{.Name}}_outbox_id_bytes CHECK (octet_length(VALUE) BETWEEN 1 AND 255) NOT VALID; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ BEGIN ALTER DOMAIN {{.Table}}_outbox_str ADD CONSTRAINT {{.Name}}_outbox_str_bytes CHECK (octet_length(VALUE) <= 255) NOT VALID; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
