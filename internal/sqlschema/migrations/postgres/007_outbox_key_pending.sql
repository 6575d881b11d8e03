-- The relay's claim takes a pending row only when no earlier pending row
-- has the same destination and ordering key. That check must probe the
-- index on (destination, order_key, seq), a few entries per row claimed.
-- Both it and the pending-rows index on seq had the predicate "sent_at IS
-- NULL AND failed_at IS NULL", so the check could also run on the index
-- on seq, walking every earlier pending row for each row claimed; the
-- planner chose that whenever the two cost about the same on paper, and a
-- claim of 100 rows from a backlog of 20,000 then took most of a second.
-- The key index's predicate is now spelled as the check spells it, and no
-- other index's predicate follows from it, so the check has one index.
-- Building it reads the whole outbox table and blocks writes to it
-- meanwhile (sent rows are kept for the relay's retention, 24 hours by
-- default); the old index is dropped after.
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_key_pending ON {{.Table}}_outbox (destination, order_key, seq) WHERE COALESCE(sent_at, failed_at) IS NULL;
DROP INDEX IF EXISTS {{.Table}}_outbox_key;
