#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod connect;
mod dedup;
mod entity;
mod error;
mod ident;
mod lock;
mod row;
mod schema;
mod sql;
mod store;
mod time;

pub use config::{
    SqliteDedupConfig, SqliteEntityConfig, SqliteLockConfig, SqliteOutboxConfig, SqliteRules,
};
pub use connect::{connect_options, open, open_in_memory, BUSY_TIMEOUT};
pub use dedup::SqliteDedupStore;
pub use entity::SqliteEntityStore;
pub use ident::{TableName, MAX_TABLE_LEN};
pub use lock::SqliteDistributedLock;
pub use schema::SCHEMA_VERSION;
pub use store::SqliteOutbox;

/// The sqlx this crate was built with: open pools and begin the transactions you pass
/// to `enqueue` with it, so both sides use one driver version.
pub use sqlx;

// Compile-time checks (tests only) that the public futures can be spawned on a
// multi-threaded runtime.
outbox_core::backend::backend_send_checks!(outbox: SqliteOutbox, dedup: SqliteDedupStore, conn: &mut sqlx::SqliteConnection);
