-- outbox-postgres, layout version 1: the outbox table under its default names, for per-key claims.
-- Generated: PgOutbox::ddl() for PgOutboxConfig::default().with_ordering(KeyOrder::PerKey) renders this
-- text (a unit test keeps them equal). outbox.sql plus the "outbox_messages_key" index per-key claims read.
-- Idempotent; see the crate README for using it with sqlx migrate.
CREATE SCHEMA IF NOT EXISTS "outbox";
CREATE TABLE IF NOT EXISTS "outbox"."outbox_schema_versions" (
    table_name text PRIMARY KEY,
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS "outbox"."outbox_messages" (
    id uuid PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    destination text NOT NULL,
    partition_key text,
    payload bytea NOT NULL,
    content_type text,
    headers jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    lease_token uuid,
    dispatched_at timestamptz,
    dead_at timestamptz
);
CREATE INDEX IF NOT EXISTS "outbox_messages_due" ON "outbox"."outbox_messages" (available_at, seq)
    WHERE dispatched_at IS NULL AND dead_at IS NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_key" ON "outbox"."outbox_messages" (partition_key, seq)
    WHERE dispatched_at IS NULL AND dead_at IS NULL AND partition_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_dispatched" ON "outbox"."outbox_messages" (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "outbox_messages_dead" ON "outbox"."outbox_messages" (id)
    WHERE dead_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS "outbox"."outbox_messages_held" (
    xid xid8 PRIMARY KEY,
    ids uuid[] NOT NULL,
    held_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO "outbox"."outbox_schema_versions" (table_name, version) VALUES ('outbox_messages', 1) ON CONFLICT (table_name) DO NOTHING;
