-- outbox-postgres, layout version 1: the entity table of the decoupled consumer under its default names.
-- Generated: PgEntityStore::ddl() for PgEntityConfig::default() renders this text (a unit test keeps them equal).
-- Idempotent; see the crate README for using it with sqlx migrate.
CREATE SCHEMA IF NOT EXISTS "outbox";
CREATE TABLE IF NOT EXISTS "outbox"."outbox_schema_versions" (
    table_name text PRIMARY KEY,
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS "outbox"."outbox_entities" (
    entity_key text PRIMARY KEY,
    state jsonb NOT NULL,
    outbox jsonb NOT NULL DEFAULT '{}',
    version bigint NOT NULL CHECK (version > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO "outbox"."outbox_schema_versions" (table_name, version) VALUES ('outbox_entities', 1) ON CONFLICT (table_name) DO NOTHING;
