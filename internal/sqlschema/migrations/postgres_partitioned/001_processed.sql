-- The processed-messages table in the partitioned layout: the same columns
-- as the default layout's (with the lease-mode columns from the start),
-- range-partitioned by processed_at, one partition per time bucket. The
-- partitions are created ahead by the store (a standalone table attached
-- with ATTACH PARTITION) and dropped whole by the purge.
--
-- A primary key of a partitioned table must contain the partition key, so
-- (consumer, message_id) alone is not unique in PostgreSQL's eyes: the
-- store makes it unique by taking a transaction-scoped advisory lock on
-- the (table, consumer, message ID) before it looks the ID up in every
-- partition and inserts it into the current one.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer         text COLLATE "C" NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    message_id       text COLLATE "C" NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
    fingerprint      bytea NOT NULL CHECK (octet_length(fingerprint) BETWEEN 1 AND 64),
    processed_at     timestamptz NOT NULL DEFAULT now(),
    state            smallint NOT NULL DEFAULT 2 CHECK (state BETWEEN 1 AND 3),
    token            bigint   NOT NULL DEFAULT 0,
    attempt          integer  NOT NULL DEFAULT 1,
    lease_expires_at timestamptz,
    result           bytea,
    content_type     text,
    last_error       text,
    updated_at       timestamptz,
    CONSTRAINT {{.Name}}_pkey PRIMARY KEY (consumer, message_id, processed_at)
) PARTITION BY RANGE (processed_at);
