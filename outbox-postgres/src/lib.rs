#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod connect;
mod dedup;
mod entity;
mod error;
mod held;
mod held_sql;
mod ident;
mod listener;
mod lock;
mod row;
mod schema;
mod sql;
mod store;

pub use config::{
    Notify, PgDedupConfig, PgEntityConfig, PgOutboxConfig, DEFAULT_HELD_CONNECTIONS,
    DEFAULT_RELAY_CONNECTIONS, DEFAULT_SWEEP_INTERVAL,
};
pub use dedup::PgDedupStore;
pub use entity::PgEntityStore;
pub use error::{from_sqlx, kind_for_sqlstate};
pub use ident::{PgRules, QualifiedName};
pub use listener::{spawn_listener, ListenerHandle};
pub use lock::PgDistributedLock;
pub use schema::SCHEMA_VERSION;
pub use store::PgOutbox;

/// The sqlx this crate was built with: open pools and begin the transactions you pass
/// to `enqueue` with it, so both sides use one driver version.
pub use sqlx;

// Compile-time checks (tests only) that the public futures can be spawned on a
// multi-threaded runtime.
outbox_core::backend::backend_send_checks!(outbox: PgOutbox, dedup: PgDedupStore, conn: &mut sqlx::PgConnection);
