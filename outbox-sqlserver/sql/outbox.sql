-- outbox-sqlserver, layout version 2: the outbox table under its default names.
-- Generated: MssqlOutbox::ddl() for MssqlOutboxConfig::default() renders this text (a unit test keeps them equal).
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
IF OBJECT_ID(N'[outbox].[outbox_messages]', N'U') IS NULL
BEGIN
CREATE TABLE [outbox].[outbox_messages] (
    id binary(16) NOT NULL,
    seq bigint IDENTITY(1, 1) NOT NULL,
    bucket AS CAST(CAST(SUBSTRING(id, 16, 1) AS int) % 16 AS tinyint) PERSISTED NOT NULL,
    destination nvarchar(max) COLLATE Latin1_General_100_BIN2 NOT NULL,
    partition_key nvarchar(400) COLLATE Latin1_General_100_BIN2 NULL,
    payload varbinary(max) NOT NULL,
    content_type nvarchar(max) NULL,
    headers nvarchar(max) NOT NULL CONSTRAINT [outbox_messages_headers_default] DEFAULT N'{}',
    created_at datetime2(7) NOT NULL CONSTRAINT [outbox_messages_created_default] DEFAULT SYSUTCDATETIME(),
    available_at datetime2(7) NOT NULL,
    attempts int NOT NULL CONSTRAINT [outbox_messages_attempts_default] DEFAULT 0,
    last_error nvarchar(max) NULL,
    lease_token binary(16) NULL,
    dispatched_at datetime2(7) NULL,
    dead_at datetime2(7) NULL,
    CONSTRAINT [outbox_messages_pk] PRIMARY KEY NONCLUSTERED (id)
);
ALTER TABLE [outbox].[outbox_messages] SET (LOCK_ESCALATION = DISABLE);
END;
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[outbox].[outbox_messages]') AND name = N'outbox_messages_clustered')
    CREATE UNIQUE CLUSTERED INDEX [outbox_messages_clustered] ON [outbox].[outbox_messages] (bucket, seq);
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[outbox].[outbox_messages]') AND name = N'outbox_messages_due')
    CREATE INDEX [outbox_messages_due] ON [outbox].[outbox_messages] (available_at, seq) INCLUDE (id, partition_key, lease_token, created_at, dispatched_at, dead_at) WHERE dispatched_at IS NULL AND dead_at IS NULL;
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[outbox].[outbox_messages]') AND name = N'outbox_messages_key')
    CREATE INDEX [outbox_messages_key] ON [outbox].[outbox_messages] (partition_key, seq) INCLUDE (dispatched_at, dead_at) WHERE dispatched_at IS NULL AND dead_at IS NULL AND partition_key IS NOT NULL;
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[outbox].[outbox_messages]') AND name = N'outbox_messages_dispatched')
    CREATE INDEX [outbox_messages_dispatched] ON [outbox].[outbox_messages] (dispatched_at) WHERE dispatched_at IS NOT NULL;
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N'[outbox].[outbox_messages]') AND name = N'outbox_messages_dead')
    CREATE INDEX [outbox_messages_dead] ON [outbox].[outbox_messages] (id) INCLUDE (dead_at) WHERE dead_at IS NOT NULL;
IF CAST(SERVERPROPERTY('ProductMajorVersion') AS int) >= 15 OR CAST(SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)
    EXEC(N'IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N''[outbox].[outbox_messages]'') AND name = N''outbox_messages_pk'' AND optimize_for_sequential_key = 0) ALTER INDEX [outbox_messages_pk] ON [outbox].[outbox_messages] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON); IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N''[outbox].[outbox_messages]'') AND name = N''outbox_messages_due'' AND optimize_for_sequential_key = 0) ALTER INDEX [outbox_messages_due] ON [outbox].[outbox_messages] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON); IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID(N''[outbox].[outbox_messages]'') AND name = N''outbox_messages_dispatched'' AND optimize_for_sequential_key = 0) ALTER INDEX [outbox_messages_dispatched] ON [outbox].[outbox_messages] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);');
IF NOT EXISTS (SELECT 1 FROM [outbox].[outbox_schema_versions] WHERE table_name = N'outbox_messages')
    INSERT INTO [outbox].[outbox_schema_versions] (table_name, version) VALUES (N'outbox_messages', 2);
