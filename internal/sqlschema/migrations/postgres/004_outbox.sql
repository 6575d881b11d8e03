-- The outbox: messages a handler emitted in its transaction (or that any
-- program wrote in its own transaction), sent by the relay after commit.
-- The schema is documented in docs/outbox.md and kept stable, since
-- programs in other languages write rows into it.
--
-- id: the outgoing message ID, carried to the broker for downstream
-- deduplication. seq: the emission order, assigned at insert; per
-- destination and non-empty order_key, rows are sent in seq order.
-- A row is pending while sent_at and failed_at are NULL; available_at is
-- when it may be tried (again); lease_until reserves it for one relay.
CREATE TABLE IF NOT EXISTS {{.Table}}_outbox (
    id           text COLLATE "C" NOT NULL CHECK (octet_length(id) BETWEEN 1 AND 255),
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    consumer     text COLLATE "C" NOT NULL DEFAULT '' CHECK (octet_length(consumer) <= 255),
    source_id    text COLLATE "C" NOT NULL DEFAULT '' CHECK (octet_length(source_id) <= 255),
    destination  text COLLATE "C" NOT NULL CHECK (octet_length(destination) BETWEEN 1 AND 255),
    order_key    text COLLATE "C" NOT NULL DEFAULT '' CHECK (octet_length(order_key) <= 255),
    payload      bytea NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    lease_until  timestamptz,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text,
    sent_at      timestamptz,
    failed_at    timestamptz,
    CONSTRAINT {{.Name}}_outbox_pkey PRIMARY KEY (id)
);
-- Pending rows in order (the relay's claim; a duplicate's look-up of its
-- message's pending rows filters them), per key (the order check), and
-- done rows by age (purge). seq is unique by construction (an identity).
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_pend ON {{.Table}}_outbox (seq) WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_key ON {{.Table}}_outbox (destination, order_key, seq) WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_sent ON {{.Table}}_outbox (sent_at) WHERE sent_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{.Name}}_outbox_fail ON {{.Table}}_outbox (failed_at) WHERE failed_at IS NOT NULL;
-- Relays LISTEN on the channel '<table name>_outbox': one notification per
-- inserting statement, delivered at commit, whoever inserts.
CREATE OR REPLACE FUNCTION {{.Table}}_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('{{.Name}}_outbox', ''); RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER {{.Name}}_outbox_notify AFTER INSERT ON {{.Table}}_outbox FOR EACH STATEMENT EXECUTE FUNCTION {{.Table}}_outbox_notify();
