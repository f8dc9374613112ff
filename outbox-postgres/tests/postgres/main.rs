//! PostgreSQL-specific behaviour beyond the conformance suite: typed bad input, fencing
//! against a real re-claim, NOTIFY on commit, the listener, relays surviving killed
//! connections, advisory locks, the inbox table and undecodable rows.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test postgres`
//!
//! Every test makes its own schema.

#[path = "../common/mod.rs"]
mod common;

mod history;
mod inbox;
mod input;
mod lock;
mod notify;
mod ordering;
mod relay;
mod settle;
mod store;

use outbox_core::NewMessage;
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use sqlx::PgPool;

/// A fresh outbox in its own schema, installed.
async fn outbox(pool: &PgPool, config: PgOutboxConfig) -> PgOutbox {
    let outbox = PgOutbox::new(pool.clone(), config.schema(common::schema_name())).unwrap();
    outbox.install().await.unwrap();
    outbox
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
    format!(
        "\"{}\".\"{}\"",
        outbox.config().schema_name(),
        outbox.config().table_name()
    )
}

/// Rows in the outbox table, whatever their state.
async fn row_count(outbox: &PgOutbox) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {}", table(outbox)))
        .fetch_one(outbox.pool())
        .await
        .unwrap()
}

/// `EXPLAIN (ANALYZE)` of the store's real claim statement for `limit` rows. The claim
/// runs inside a transaction that is rolled back, so nothing stays leased.
async fn explain_claim(outbox: &PgOutbox, limit: i64) -> String {
    let mut tx = outbox.pool().begin().await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, COSTS OFF) {}",
        outbox.claim_statement()
    ))
    .bind(limit)
    .bind(30_000_000_i64)
    .bind(uuid::Uuid::new_v4())
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    plan.join("\n")
}
