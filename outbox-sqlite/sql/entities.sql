-- outbox-sqlite, layout version 1: the entity table under its default name.
-- Generated: SqliteEntityStore::ddl() for SqliteEntityConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the sqlite3 shell or your migration tool.
CREATE TABLE IF NOT EXISTS "outbox_schema_versions" (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    installed_at INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS "outbox_entities" (
    entity_key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    outbox TEXT NOT NULL DEFAULT '{}',
    version INTEGER NOT NULL CHECK (version > 0),
    updated_at INTEGER NOT NULL
) STRICT;
INSERT INTO "outbox_schema_versions" (table_name, version, installed_at) VALUES ('outbox_entities', 1, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) ON CONFLICT (table_name) DO NOTHING;
