-- outbox-postgres, layout version 1: the inbox table under its default names.
-- Generated: PgDedupStore::ddl() for PgDedupConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent; see the crate README for using it with sqlx migrate.
CREATE SCHEMA IF NOT EXISTS "outbox";
CREATE TABLE IF NOT EXISTS "outbox"."outbox_schema_versions" (
    table_name text PRIMARY KEY,
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS "outbox"."outbox_inbox" (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS "outbox_inbox_processed_at" ON "outbox"."outbox_inbox" (processed_at);
INSERT INTO "outbox"."outbox_schema_versions" (table_name, version) VALUES ('outbox_inbox', 1) ON CONFLICT (table_name) DO NOTHING;
