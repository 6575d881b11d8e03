-- Replaces the default layout's 012, the partial index of the failed
-- records: PostgreSQL cannot build an index on a partitioned table
-- concurrently, and a plain build would block the writers of every
-- partition while it reads them. The partitioned table has no
-- (consumer, processed_at) index either, so its operator lists read every
-- partition (docs/console.md, "At size"). This migration changes nothing.
SELECT 1;
