//! PostgreSQL-specific behaviour beyond the conformance suite: typed bad input,
//! duplicate ids that leave the caller's transaction usable, fencing against a real
//! re-claim, poison rows, query plans without statistics, NOTIFY on commit, the
//! listener, relays surviving killed connections, advisory locks, the inbox table, and
//! the indexes each configuration installs.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test postgres`
//!
//! Every test makes its own schema.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod held;
mod history;
mod inbox;
mod indexes;
mod input;
mod lock;
mod notify;
mod ordering;
mod plan_suite;
mod plans;
mod poison;
mod relay;
mod settle;
mod store;

use outbox_core::NewMessage;
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use sqlx::PgPool;

/// A fresh outbox in its own schema, installed.
async fn outbox(pool: &PgPool, config: PgOutboxConfig) -> PgOutbox {
    let outbox = PgOutbox::new(pool.clone(), config.with_schema(common::schema_name())).unwrap();
    outbox.install().await.unwrap();
    outbox
}

/// A `pg_test!` fixture: a pool of `max` connections and a fresh [`outbox`] on it.
async fn pg_outbox(what: &str, max: u32, config: PgOutboxConfig) -> Option<(PgPool, PgOutbox)> {
    let pool = common::connect(what, max).await?;
    let outbox = outbox(&pool, config).await;
    Some((pool, outbox))
}

/// Enqueue `messages` in one committed transaction.
async fn enqueue(outbox: &PgOutbox, messages: &[NewMessage]) {
    let mut tx = outbox.pool().begin().await.unwrap();
    outbox.enqueue(&mut tx, messages).await.unwrap();
    tx.commit().await.unwrap();
}

fn msg(n: usize) -> NewMessage {
    NewMessage::builder("pg.tests")
        .payload(format!("payload {n}").into_bytes())
        .build()
        .unwrap()
}

/// `"schema"."table"` of an outbox, for test SQL.
fn table(outbox: &PgOutbox) -> String {
    outbox.qualified_name().to_string()
}

/// Rows in the outbox table, whatever their state.
async fn row_count(outbox: &PgOutbox) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {}", table(outbox)))
        .fetch_one(outbox.pool())
        .await
        .unwrap()
}
