//! SQLite-specific behaviour beyond the shared suites: enqueue in the caller's
//! transaction, poison rows, several processes on one file, the busy timeout, schema
//! installs.
//!
//! Run: `cargo test -p outbox-sqlite --test sqlite`

#[path = "../common/mod.rs"]
mod common;

mod cancel;
mod enqueue;
mod inbox;
mod lock;
mod plans;
mod poison;
mod processes;
mod schema;

use std::time::Duration;

use outbox_core::NewMessage;
use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};

/// A lease no test outlives.
pub const LONG: Duration = Duration::from_secs(300);

/// An outbox with default settings, installed on `db`.
pub async fn outbox(db: &common::TempDb) -> SqliteOutbox {
    let outbox = SqliteOutbox::new(db.pool().clone(), SqliteOutboxConfig::default()).unwrap();
    outbox.install().await.unwrap();
    outbox
}

/// A small valid message.
pub fn msg(n: u32) -> NewMessage {
    NewMessage::builder("sqlite.tests")
        .payload(format!("message {n}").into_bytes())
        .build()
        .unwrap()
}

/// Enqueue `messages` in a transaction of their own.
pub async fn enqueue(outbox: &SqliteOutbox, messages: &[NewMessage]) {
    let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    outbox.enqueue(&mut tx, messages).await.unwrap();
    tx.commit().await.unwrap();
}

/// How many rows the outbox table holds.
pub async fn rows(outbox: &SqliteOutbox) -> i64 {
    let sql = format!("SELECT count(*) FROM {}", outbox.qualified_name());
    sqlx::query_scalar(&sql)
        .fetch_one(outbox.pool())
        .await
        .unwrap()
}
