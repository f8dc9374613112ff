-- outbox-mysql, layout version 1: the inbox table under its default name.
-- Generated: MySqlDedupStore::ddl() for MySqlDedupConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the mysql client or your migration tool (MySQL 8.0+, MariaDB 10.6+).
CREATE DATABASE IF NOT EXISTS `outbox`;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_schema_versions` (
    table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
    version INT NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_inbox` (
    consumer VARBINARY(255) NOT NULL,
    message_id BINARY(16) NOT NULL,
    processed_at DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY `outbox_inbox_processed_at` (processed_at)
) ENGINE = InnoDB;
INSERT INTO `outbox`.`outbox_schema_versions` (table_name, version) VALUES ('outbox_inbox', 1) ON DUPLICATE KEY UPDATE version = version;
