-- Recovery points, as in the default layout. The partitioned layout has
-- no lease mode, so nothing writes them; the purge's row deletes (with
-- Partitions.ExactPurge) delete from it like the default layout's.
CREATE TABLE IF NOT EXISTS {{.Table}}_steps (
    consumer   text COLLATE "C" NOT NULL,
    message_id text COLLATE "C" NOT NULL,
    step       text COLLATE "C" NOT NULL CHECK (octet_length(step) BETWEEN 1 AND 255),
    result     bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {{.Name}}_steps_pkey PRIMARY KEY (consumer, message_id, step)
);
-- Horizons: the newest retention horizon each consumer's purge has
-- reached (the downtime-safe horizon of idem's retention, computed by the
-- purging consumer from its runs). A partition is dropped once every
-- consumer with records in it has a horizon at or past the partition's
-- upper bound, so a consumer that never purges again holds back the drop
-- of every partition that holds its records.
CREATE TABLE IF NOT EXISTS {{.Table}}_horizons (
    consumer text COLLATE "C" NOT NULL PRIMARY KEY CHECK (octet_length(consumer) BETWEEN 1 AND 255),
    horizon  timestamptz NOT NULL
);
