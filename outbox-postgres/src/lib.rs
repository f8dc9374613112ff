#![doc = include_str!("../README.md")]

mod admin;
mod config;
mod connect;
mod dedup;
mod entity;
mod error;
mod ident;
mod listener;
mod lock;
mod row;
mod schema;
mod sql;
mod store;

pub use config::{
    Notify, PgDedupConfig, PgEntityConfig, PgOutboxConfig, DEFAULT_RELAY_CONNECTIONS,
};
pub use dedup::PgDedupStore;
pub use entity::PgEntityStore;
pub use ident::{PgRules, QualifiedName};
pub use listener::{spawn_listener, ListenerHandle};
pub use lock::PgDistributedLock;
pub use schema::SCHEMA_VERSION;
pub use store::PgOutbox;

/// The sqlx this crate was built with: open pools and begin the transactions you pass
/// to `enqueue` with it, so both sides use one driver version.
pub use sqlx;

/// Compile-time checks that the public futures can be spawned on a multi-threaded
/// runtime (a non-`Send` future here is easy to introduce with sqlx and hard to spot).
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    use super::*;
    use outbox_core::{
        ClaimRequest, DeadLetterPage, DeadLetterSelection, OutboxAdmin, OutboxStore,
    };

    fn assert_send<T: Send>(_: T) {}

    fn public_futures_are_send(
        outbox: &PgOutbox,
        dedup: &PgDedupStore,
        conn: &mut sqlx::PgConnection,
        messages: &[outbox_core::NewMessage],
        request: ClaimRequest,
        page: &DeadLetterPage,
        selection: &DeadLetterSelection,
    ) {
        assert_send(outbox.install());
        assert_send(dedup.install());
        assert_send(outbox.enqueue(conn, messages));
        assert_send(outbox.claim(request));
        assert_send(outbox.dead_letters(page));
        assert_send(outbox.requeue_dead(selection));
    }
}
