#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod dedup;
mod entity;
mod error;
mod held;
mod held_sql;
mod lock;
mod row;
mod schema;
mod sql;
mod store;

pub use config::{
    MySqlClaimConfig, MySqlDedupConfig, MySqlEntityConfig, MySqlOutboxConfig, MySqlRules,
    QualifiedName, DEFAULT_HELD_CONNECTIONS, DEFAULT_SWEEP_INTERVAL, MAX_TEXT_BYTES,
};
pub use dedup::MySqlDedupStore;
pub use entity::MySqlEntityStore;
pub use lock::MySqlDistributedLock;
pub use schema::SCHEMA_VERSION;
pub use store::MySqlOutbox;

/// The sqlx this crate was built with: open pools and begin the transactions you pass
/// to `enqueue` with it, so both sides use one driver version.
pub use sqlx;

outbox_core::backend::backend_send_checks!(outbox: MySqlOutbox, dedup: MySqlDedupStore, conn: &mut sqlx::MySqlConnection);
