-- outbox-sqlserver, layout version 1: the inbox table under its default names.
-- Generated: MssqlDedupStore::ddl() for MssqlDedupConfig::default() renders this text (a unit test keeps them equal).
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
IF OBJECT_ID(N'[outbox].[outbox_inbox]', N'U') IS NULL
CREATE TABLE [outbox].[outbox_inbox] (
    consumer nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    message_id binary(16) NOT NULL,
    processed_at datetime2(7) NOT NULL CONSTRAINT [outbox_inbox_processed_default] DEFAULT SYSUTCDATETIME(),
    CONSTRAINT [outbox_inbox_pk] PRIMARY KEY (consumer, message_id)
);
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[outbox].[outbox_inbox]') AND name = N'outbox_inbox_processed_at')
    CREATE INDEX [outbox_inbox_processed_at] ON [outbox].[outbox_inbox] (processed_at);
IF CAST(SERVERPROPERTY('ProductMajorVersion') AS int) >= 15 OR CAST(SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)
    EXEC(N'IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N''[outbox].[outbox_inbox]'') AND name = N''outbox_inbox_pk'' AND optimize_for_sequential_key = 0) ALTER INDEX [outbox_inbox_pk] ON [outbox].[outbox_inbox] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON); IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N''[outbox].[outbox_inbox]'') AND name = N''outbox_inbox_processed_at'' AND optimize_for_sequential_key = 0) ALTER INDEX [outbox_inbox_processed_at] ON [outbox].[outbox_inbox] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);');
IF NOT EXISTS (SELECT 1 FROM [outbox].[outbox_schema_versions] WHERE table_name = N'outbox_inbox')
    INSERT INTO [outbox].[outbox_schema_versions] (table_name, version) VALUES (N'outbox_inbox', 1);
