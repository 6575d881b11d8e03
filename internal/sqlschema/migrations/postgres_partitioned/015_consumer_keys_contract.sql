-- Replaces the default layout's 015 (see 014_consumer_keys.sql): the
-- partitioned layout keeps the consumer name. This migration changes nothing.
SELECT 1;
