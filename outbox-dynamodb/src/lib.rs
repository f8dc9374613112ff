#![doc = include_str!("../README.md")]

mod admin;
mod body;
#[cfg(test)]
mod capacity_tests;
mod claim;
mod complete;
mod concurrency;
mod config;
mod dead_letter;
mod dead_letter_admin;
mod dedup;
mod enqueue;
mod entity;
mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod item;
pub mod kit;
mod lock;
mod markers;
mod meta;
mod metrics;
mod renew;
mod renewal_budget;
mod schema;
mod schema_check;
mod settle;
mod shards;
mod store;
mod sweep;
mod throttles;

pub use config::{
    validate_table_name, DynamoDedupConfig, DynamoEntityConfig, DynamoLockConfig,
    DynamoOutboxConfig, DynamoRules, DEFAULT_BODY_TTL, DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_RENEWAL_BUDGET, DEFAULT_SHARDS, DEFAULT_SHARD_LEASE, MAX_SHARDS,
};
pub use dedup::DynamoDedupStore;
pub use enqueue::check_transaction;
pub use entity::DynamoEntityStore;
pub use item::{MAX_ITEM_BYTES, MAX_TRANSACTION_ACTIONS, MAX_TRANSACTION_BYTES};
pub use lock::{DynamoDistributedLock, DynamoLockGuard};
pub use metrics::OutboxMetrics;
pub use store::DynamoOutbox;
pub use throttles::Throttled;

/// The AWS SDK this crate was built with: build your `Client` and transaction items
/// with it, so both sides use one SDK version.
pub use aws_sdk_dynamodb;

/// Compile-time checks that the public futures can be spawned on a multi-threaded
/// runtime.
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    use super::*;
    use outbox_core::consumer::{EntityRecord, EntityStore};
    use outbox_core::{
        store::ClaimRequest, ConsumerName, DeadLetterPage, DeadLetterSelection, DedupStore,
        EntityKey, MessageId, OutboxAdmin, OutboxStore,
    };

    fn assert_send<T: Send>(_: T) {}

    #[allow(clippy::too_many_arguments)]
    fn public_futures_are_send(
        outbox: &DynamoOutbox,
        dedup: &DynamoDedupStore,
        entities: &DynamoEntityStore,
        messages: &[outbox_core::NewMessage],
        request: ClaimRequest,
        page: &DeadLetterPage,
        selection: &DeadLetterSelection,
        consumer: &ConsumerName,
        key: &EntityKey,
        record: &EntityRecord,
    ) {
        assert_send(outbox.install());
        assert_send(outbox.enqueue(Vec::new(), messages));
        assert_send(outbox.claim(request));
        assert_send(outbox.dead_letters(page));
        assert_send(outbox.requeue_dead(selection));
        assert_send(dedup.record(consumer, MessageId::new()));
        assert_send(entities.persist(key, None, record));
    }
}
