-- Replaces the default layout's 014 and 015 (schema v2: the consumer
-- stored as a key): the partitioned layout keeps the consumer name in its
-- rows and its primary key (consumer, message_id, processed_at). Its
-- records are dropped a partition at a time, and a change of its key
-- would have to reach every partition. This migration changes nothing.
SELECT 1;
