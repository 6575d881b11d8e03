-- Replaces the default layout's 016 (see 016_record_point.sql there): the
-- partitioned layout keeps schema v1, whose statements write every
-- recovery point to {{.Table}}_steps. This migration changes nothing.
SELECT 1;
