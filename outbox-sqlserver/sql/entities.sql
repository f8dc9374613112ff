-- outbox-sqlserver, layout version 1: the entity table of the decoupled consumer under its default names.
-- Generated: MssqlEntityStore::ddl() for MssqlEntityConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent, one batch (no GO needed): run it with sqlcmd or your migration tool.
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
IF SCHEMA_ID(N'outbox') IS NULL EXEC(N'CREATE SCHEMA [outbox]');
IF OBJECT_ID(N'[outbox].[outbox_schema_versions]', N'U') IS NULL
CREATE TABLE [outbox].[outbox_schema_versions] (
    table_name nvarchar(128) NOT NULL CONSTRAINT [outbox_schema_versions_pk] PRIMARY KEY,
    version int NOT NULL,
    installed_at datetime2(7) NOT NULL CONSTRAINT [outbox_schema_versions_installed_default] DEFAULT SYSUTCDATETIME()
);
IF OBJECT_ID(N'[outbox].[outbox_entities]', N'U') IS NULL
CREATE TABLE [outbox].[outbox_entities] (
    entity_key nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    state nvarchar(max) NOT NULL,
    outbox nvarchar(max) NOT NULL CONSTRAINT [outbox_entities_outbox_default] DEFAULT N'{}',
    version bigint NOT NULL CONSTRAINT [outbox_entities_version_check] CHECK (version > 0),
    updated_at datetime2(7) NOT NULL CONSTRAINT [outbox_entities_updated_default] DEFAULT SYSUTCDATETIME(),
    CONSTRAINT [outbox_entities_pk] PRIMARY KEY (entity_key)
);
IF NOT EXISTS (SELECT 1 FROM [outbox].[outbox_schema_versions] WHERE table_name = N'outbox_entities')
    INSERT INTO [outbox].[outbox_schema_versions] (table_name, version) VALUES (N'outbox_entities', 1);
