#![doc = include_str!("../README.md")]

mod config;
pub mod dedup;
mod error;
pub mod listener;
pub mod lock;
mod row;
pub mod schema;
mod sql;
pub mod store;

pub use config::{
    validate_identifier, NotifyMode, PgDedupConfig, PgOutboxConfig, MAX_IDENTIFIER_LEN,
};
pub use dedup::PgDedupStore;
pub use listener::{spawn_listener, ListenerHandle};
pub use lock::{PgAdvisoryLock, PgLockGuard};
pub use schema::{ddl, install, SCHEMA_VERSION};
pub use store::PgOutbox;

/// Compile-time checks that the public futures can be spawned on a multi-threaded
/// runtime (a non-`Send` future here is easy to introduce with sqlx and hard to spot).
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    use super::*;

    fn assert_send<T: Send>(_: T) {}

    fn public_futures_are_send(
        pool: &sqlx::PgPool,
        outbox: &PgOutbox,
        dedup: &PgDedupStore,
        conn: &mut sqlx::PgConnection,
        messages: &[outbox_core::NewMessage],
    ) {
        assert_send(install(pool, outbox.config()));
        assert_send(outbox.install());
        assert_send(dedup.install());
        assert_send(outbox.enqueue(conn, messages));
        assert_send(dedup.record_in(conn, "c", outbox_core::MessageId::new()));
    }
}
