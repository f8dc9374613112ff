-- outbox-mysql, layout version 1: the outbox table under its default name.
-- Generated: MySqlOutbox::ddl() for MySqlOutboxConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the mysql client or your migration tool (MySQL 8.0+, MariaDB 10.6+).
CREATE DATABASE IF NOT EXISTS `outbox`;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_schema_versions` (
    table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
    version INT NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_messages` (
    id BINARY(16) NOT NULL PRIMARY KEY,
    seq BIGINT NOT NULL AUTO_INCREMENT,
    destination VARBINARY(1024) NOT NULL,
    partition_key VARBINARY(1024),
    payload LONGBLOB NOT NULL,
    content_type BLOB,
    headers JSON NOT NULL,
    created_at DATETIME(6) NOT NULL,
    available_at DATETIME(6) NOT NULL,
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT CHARACTER SET utf8mb4,
    lease_token BINARY(16),
    dispatched_at DATETIME(6),
    dead_at DATETIME(6),
    due_at DATETIME(6) AS (IF(dispatched_at IS NULL AND dead_at IS NULL, available_at, NULL)) STORED,
    key_head VARBINARY(1024) AS (IF(dispatched_at IS NULL AND dead_at IS NULL, partition_key, NULL)) STORED,
    dead_flag TINYINT AS (IF(dead_at IS NULL, NULL, 1)) STORED,
    KEY `outbox_messages_seq` (seq),
    KEY `outbox_messages_due` (due_at, seq),
    KEY `outbox_messages_key` (key_head, seq),
    KEY `outbox_messages_dispatched` (dispatched_at),
    KEY `outbox_messages_dead` (dead_flag)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_messages_held` (
    batch BINARY(16) NOT NULL PRIMARY KEY,
    ids JSON NOT NULL,
    held_at DATETIME(6) NOT NULL,
    KEY `outbox_messages_held_at` (held_at)
) ENGINE = InnoDB;
INSERT INTO `outbox`.`outbox_schema_versions` (table_name, version) VALUES ('outbox_messages', 1) ON DUPLICATE KEY UPDATE version = version;
