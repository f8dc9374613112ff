-- outbox-sqlite, layout version 1: the lock table under its default name.
-- Generated: SqliteDistributedLock::ddl() for SqliteLockConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the sqlite3 shell or your migration tool.
CREATE TABLE IF NOT EXISTS "outbox_schema_versions" (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    installed_at INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS "outbox_locks" (
    name TEXT PRIMARY KEY,
    holder BLOB NOT NULL CHECK (length(holder) = 16),
    expires_at INTEGER NOT NULL
) STRICT;
INSERT INTO "outbox_schema_versions" (table_name, version, installed_at) VALUES ('outbox_locks', 1, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) ON CONFLICT (table_name) DO NOTHING;
