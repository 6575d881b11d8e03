-- The failed rows' index holds their ID after failed_at, in the order the
-- operator lists them (newest failure first, then by ID), so a page is
-- read in index order under its limit rather than sorted from every
-- failed row. Same predicate as before (the relay's purge uses it too).
DROP INDEX IF EXISTS {{.Table}}_outbox_fail;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_failed ON {{.Table}}_outbox (failed_at, id) WHERE failed_at IS NOT NULL;
