-- outbox-sqlite, layout version 1: the outbox table under its default name.
-- Generated: SqliteOutbox::ddl() for SqliteOutboxConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the sqlite3 shell or your migration tool.
CREATE TABLE IF NOT EXISTS "outbox_schema_versions" (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    installed_at INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS "outbox_messages" (
    seq INTEGER PRIMARY KEY,
    id BLOB NOT NULL UNIQUE CHECK (length(id) = 16),
    destination TEXT NOT NULL,
    partition_key TEXT,
    payload BLOB NOT NULL,
    content_type TEXT,
    headers TEXT NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    lease_token BLOB CHECK (length(lease_token) = 16),
    dispatched_at INTEGER,
    dead_at INTEGER
) STRICT;
CREATE INDEX IF NOT EXISTS "outbox_messages_due" ON "outbox_messages" (available_at, seq)
    WHERE dispatched_at IS NULL AND dead_at IS NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_key" ON "outbox_messages" (partition_key, seq)
    WHERE dispatched_at IS NULL AND dead_at IS NULL AND partition_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_dispatched" ON "outbox_messages" (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_dead" ON "outbox_messages" (id)
    WHERE dead_at IS NOT NULL;
INSERT INTO "outbox_schema_versions" (table_name, version, installed_at) VALUES ('outbox_messages', 1, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) ON CONFLICT (table_name) DO NOTHING;
