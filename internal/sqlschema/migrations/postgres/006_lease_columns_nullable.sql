-- Transactional records without lease-mode values: state, token and
-- attempt become nullable without a default, so that a transactional
-- claim, which inserts only consumer, message_id and fingerprint, writes
-- NULLs (a bit in the row's null bitmap) instead of three stored values,
-- and each record is narrower. Every statement reads a NULL state as
-- completed (2), a NULL token as 0 and a NULL attempt as 1: what a
-- transactional record is, and what the rows written before this
-- migration hold. Lease-mode writes set all three explicitly.
--
-- Both changes are catalog-only: no row is rewritten or scanned, and the
-- rows already there keep their values (also those stored as the value
-- the columns were added with, which dropping a default does not
-- change). The CHECK on state lets NULL through. On the partitioned
-- layout the change reaches every partition, and partitions created
-- later copy the parent's columns.
ALTER TABLE {{.Table}}
    ALTER COLUMN state DROP NOT NULL,
    ALTER COLUMN state DROP DEFAULT,
    ALTER COLUMN token DROP NOT NULL,
    ALTER COLUMN token DROP DEFAULT,
    ALTER COLUMN attempt DROP NOT NULL,
    ALTER COLUMN attempt DROP DEFAULT;
