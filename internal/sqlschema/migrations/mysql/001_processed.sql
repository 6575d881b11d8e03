-- The processed-messages table (the inbox): one row per (consumer, message ID).
-- VARBINARY compares byte for byte: no collation, no case folding, no
-- trailing-space padding, whatever the server's defaults are.
-- processed_at is UTC, written by the server (UTC_TIMESTAMP(6)).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     VARBINARY(255) NOT NULL,
    message_id   VARBINARY(255) NOT NULL,
    fingerprint  VARBINARY(64)  NOT NULL,
    processed_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY {{.Name}}_processed_at_idx (consumer, processed_at)
) ENGINE=InnoDB;
