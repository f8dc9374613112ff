-- outbox-sqlite, layout version 1: the inbox (dedup) table under its default name.
-- Generated: SqliteDedupStore::ddl() for SqliteDedupConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent: apply it with the sqlite3 shell or your migration tool.
CREATE TABLE IF NOT EXISTS "outbox_schema_versions" (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    installed_at INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS "outbox_inbox" (
    consumer TEXT NOT NULL,
    message_id BLOB NOT NULL CHECK (length(message_id) = 16),
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS "outbox_inbox_processed_at" ON "outbox_inbox" (processed_at);
INSERT INTO "outbox_schema_versions" (table_name, version, installed_at) VALUES ('outbox_inbox', 1, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) ON CONFLICT (table_name) DO NOTHING;
