-- Waking relays costs less when it happens after commit. A transaction
-- that has called pg_notify takes a lock at commit that every other
-- notifying transaction of the server waits for, and holds it until its
-- commit is flushed to disk: with synchronous_commit on, notifying commits
-- run one at a time, each waiting for its own flush. The trigger still
-- notifies for every writer (any program writing rows in its own
-- transaction), except a transaction that sets idem.outbox_quiet to 'on'
-- for itself: idem's pgx store does, for the transactions it begins, and
-- sends the notification itself after their commit, outside them.
CREATE OR REPLACE FUNCTION {{.Table}}_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF current_setting('idem.outbox_quiet', true) IS DISTINCT FROM 'on' THEN PERFORM pg_notify('{{.Name}}_outbox', ''); END IF; RETURN NULL; END $$;
