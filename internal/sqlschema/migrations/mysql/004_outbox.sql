-- The outbox: messages a handler emitted in its transaction (or that any
-- program wrote in its own transaction), sent by the relay after commit.
-- The schema is documented in docs/outbox.md and kept stable, since
-- programs in other languages write rows into it.
--
-- id: the outgoing message ID. seq: the emission order (AUTO_INCREMENT);
-- per destination and non-empty order_key, rows are sent in seq order.
-- A row is pending while sent_at and failed_at are NULL. Times are UTC
-- DATETIME(6) from the server's clock (UTC_TIMESTAMP(6)). headers is a
-- JSON object of strings. Binary types: byte-for-byte comparison whatever
-- the connection's character set and collation.
CREATE TABLE IF NOT EXISTS {{.Table}}_outbox (
    seq          BIGINT         NOT NULL AUTO_INCREMENT,
    id           VARBINARY(255) NOT NULL,
    consumer     VARBINARY(255) NOT NULL DEFAULT '',
    source_id    VARBINARY(255) NOT NULL DEFAULT '',
    destination  VARBINARY(255) NOT NULL,
    order_key    VARBINARY(255) NOT NULL DEFAULT '',
    payload      LONGBLOB       NOT NULL,
    headers      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '{}',
    created_at   DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    available_at DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    lease_until  DATETIME(6)    NULL,
    attempts     INT            NOT NULL DEFAULT 0,
    last_error   MEDIUMTEXT CHARACTER SET utf8mb4 NULL,
    sent_at      DATETIME(6)    NULL,
    failed_at    DATETIME(6)    NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY {{.Name}}_outbox_id (id),
    KEY {{.Name}}_outbox_pend (sent_at, failed_at, seq),
    KEY {{.Name}}_outbox_key (destination, order_key, seq)
) ENGINE=InnoDB;
