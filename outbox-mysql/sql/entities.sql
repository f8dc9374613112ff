-- outbox-mysql, layout version 1: the entity table under its default name.
-- Generated: MySqlEntityStore::ddl() for MySqlEntityConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the mysql client or your migration tool (MySQL 8.0+, MariaDB 10.6+).
CREATE DATABASE IF NOT EXISTS `outbox`;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_schema_versions` (
    table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
    version INT NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS `outbox`.`outbox_entities` (
    entity_key VARBINARY(255) NOT NULL PRIMARY KEY,
    state JSON NOT NULL,
    outbox JSON NOT NULL,
    version BIGINT NOT NULL CHECK (version > 0),
    updated_at DATETIME(6) NOT NULL
) ENGINE = InnoDB;
INSERT INTO `outbox`.`outbox_schema_versions` (table_name, version) VALUES ('outbox_entities', 1) ON DUPLICATE KEY UPDATE version = version;
