#![doc = include_str!("../README.md")]

mod codec;
mod config;
mod error;
mod meters;
mod outbox;
mod relay;

pub use config::{ReplicationTarget, WalOutboxConfig, WalRelayConfig, MAX_PUBLISH_CONCURRENCY};
pub use meters::{describe_metrics, RECONNECTS, SLOT_LAG_BYTES, SLOT_LAG_SECONDS};
pub use outbox::{SlotStatus, WalOutbox, POSITIONS_TABLE};
pub use relay::{WalRelay, WalRelayReport, NON_TRANSACTIONAL_DESTINATION, UNDECODABLE_DESTINATION};

/// The sqlx this crate was built with: open pools and begin the transactions you pass
/// to `enqueue` with it.
pub use sqlx;

#[cfg(test)]
mod send_checks {
    //! The public futures can be spawned on a multi-threaded runtime.
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[allow(dead_code, clippy::diverging_sub_expression, unreachable_code)]
    fn futures_are_send(outbox: WalOutbox, relay: WalRelay, conn: &mut sqlx::PgConnection) {
        assert_send(&outbox.enqueue(conn, &[]));
        assert_send(&outbox.enqueue_with(conn, sqlx::query("DELETE FROM t"), &[]));
        assert_send(&outbox.install());
        assert_send(&outbox.slot_status());
        assert_send(&relay.run(tokio_util::sync::CancellationToken::new()));
    }
}
