-- The failed rows' index holds their ID after failed_at, in the order the
-- operator lists them (newest failure first, then by ID), so a page is
-- read in index order under its limit rather than sorted from every
-- failed row. Its predicate is the operator's (failed, not sent), which
-- the relay's purge of failed rows implies.
DROP INDEX IF EXISTS {{.Table}}_outbox_fail;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_failed ON {{.Table}}_outbox (failed_at, id) WHERE failed_at IS NOT NULL AND sent_at IS NULL;
