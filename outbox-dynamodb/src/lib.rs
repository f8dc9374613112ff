//! # outbox-dynamodb
//!
//! DynamoDB backend for the transactional outbox, on `aws-sdk-dynamodb`:
//!
//! - [`DynamoOutbox`]: an [`OutboxStore`](outbox_core::OutboxStore) and
//!   [`OutboxAdmin`](outbox_core::OutboxAdmin). Enqueue joins your own
//!   `TransactWriteItems` ([`DynamoOutbox::enqueue_writes`], or
//!   [`DynamoOutbox::enqueue`] to send your writes and the messages in one
//!   transaction). Relays find due messages without scans and without global secondary
//!   indexes, and claim each with one conditional write.
//! - [`DynamoDedupStore`]: a strongly consistent [`DedupStore`](outbox_core::DedupStore)
//!   (conditional put, consistent reads, TTL) for the decoupled consumer algorithm. One
//!   partition key per record (layout 2: no shards, no local index, no 10 GB cap);
//!   upgrading from layout 1 needs a new table, see its `## Limitations`.
//! - [`DynamoEntityStore`]: the entity store of that algorithm (a version attribute,
//!   conditional writes, a typed error before the 400 KB item limit).
//! - [`DynamoDistributedLock`]: a [`DistributedLock`](outbox_core::DistributedLock) of
//!   lease items (conditional writes, background renewal, fencing tokens) for singleton
//!   work such as purges.
//!
//! You build the [`aws_sdk_dynamodb::Client`] (with `aws-config`, or by hand as the
//! tests do) and hand it over; this crate enables no credential or region discovery.
//!
//! ```no_run
//! # async fn demo(client: aws_sdk_dynamodb::Client) -> outbox_core::Result<()> {
//! use outbox_core::{KeyOrder, NewMessage};
//! use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
//!
//! let config = DynamoOutboxConfig::default()
//!     .with_table("orders_outbox")
//!     .with_shards(8)
//!     .with_ordering(KeyOrder::PerKey);
//! let outbox = DynamoOutbox::new(client, config)?;
//! outbox.install().await?; // on-demand table with its local indexes, once
//!
//! let shipped = NewMessage::builder("orders.shipped")
//!     .partition_key("order-42")
//!     .payload(b"{\"order\":42}".to_vec())
//!     .build()?;
//! // Add the order update to the same transaction so both commit or neither does.
//! let mut writes = Vec::new(); // your TransactWriteItem values
//! # let _: &mut Vec<aws_sdk_dynamodb::types::TransactWriteItem> = &mut writes;
//! outbox.enqueue(writes, &[shipped]).await?;
//! // Run an outbox_core::Relay over `outbox` to publish.
//! # Ok(()) }
//! ```
//!
//! ## Table layout (outbox)
//!
//! One table, string keys `pk` (partition) and `sk` (sort), on-demand billing.
//!
//! | item | `pk` | `sk` | attributes |
//! |---|---|---|---|
//! | message | `q#<shard>` (shard = FNV-1a of the id mod shard count, 3 digits) | the id, hyphenated lowercase (sorts like the id) | `destination`, `pkey` (partition key), `payload` (binary), `ctype`, `headers` (JSON text), `created_us`, `avail_us`, `seq`, `attempts`, `token`, `last_error`, `due`, `dead_id`, `dead_us`, `done_us` |
//! | order marker (per-key order only) | `k#<shard of the partition key>` | `<key byte length>:<key>#<seq, 16 digits>#<id>` | `mid` (the message id) |
//!
//! Times are microseconds since the Unix epoch. Three sparse local secondary indexes
//! share the message partitions (so they are read with `ConsistentRead`, unlike global
//! ones):
//!
//! | index | sort key | present while | projection | serves |
//! |---|---|---|---|---|
//! | `due` | `due` = `avail_us` × 10¹⁶ + `seq` (number) | undelivered | `attempts`, `pkey`, `token`, `created_us` | claims (oldest availability, then enqueue order), stats |
//! | `dead` | `dead_id` = the id | dead-lettered | all | dead-letter listing in id order, counts |
//! | `done` | `done_us` | dispatched under `Retention::Keep` | keys | bounded purges, counts |
//!
//! `avail_us` doubles as the lease expiry while a message is leased; `token` is the
//! current lease's fencing token. Delivered messages leave the `due` index (deleted
//! under `Retention::Delete`), so claims never read history.
//!
//! ## Claim protocol
//!
//! 1. Query the `due` index of every shard (concurrently, `ConsistentRead = true`,
//!    `due < (now + 1 µs) × 10¹⁶`, ascending) and merge the pages: oldest availability
//!    first, then enqueue order, across shards.
//! 2. Under [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), a keyed candidate must
//!    be its key's head: the first order marker of the key (strongly consistent query,
//!    `Limit = 1`) must name it. A marker whose message is no longer undelivered (a
//!    crash between settle and marker removal) is removed there and then, by a
//!    `TransactWriteItems` of a condition check that the message is still not
//!    undelivered and the marker delete: a requeue committed meanwhile keeps its marker.
//! 3. For each candidate, one `UpdateItem` with the condition
//!    `attribute_exists(due) AND avail_us <= :now AND attempts < :max` sets a fresh
//!    token, `avail_us = now + lease`, adds one attempt, and returns the item. The
//!    conditional write is the claim: of relays racing for a message exactly one
//!    write passes; the others are refused (counted in
//!    [`OutboxMetrics::refused_writes`]) and move on to the next candidate.
//! 4. An item that does not make a valid message is dead-lettered under the new lease.
//! 5. A refused write shows the shard's page is stale (another relay took the message):
//!    the shard is read again, and for the next second this store's claims draw each
//!    batch at random from the oldest four times as many candidates as wanted (the
//!    batch is still returned in due order), so a fleet of relays spreads over
//!    different messages and shards instead of queueing behind each other's refused
//!    writes. A lone claimer never meets a refused write and keeps strict order.
//!
//! Complete, fail and release are conditional writes on `token = :token AND
//! attribute_exists(due)`; a refused one is a lost lease, reported in
//! [`Settled::lost`](outbox_core::Settled::lost). Under `Retention::Delete` without
//! per-key order, completes travel 25 to a request as PartiQL `BatchExecuteStatement`
//! deletes with the same condition (`DELETE ... WHERE pk = ? AND sk = ? AND token = ?
//! AND due IS NOT MISSING`): each statement is its own conditional write (one write
//! unit, not a transaction), so a lost lease fails alone.
//!
//! ## Strongly consistent reads
//!
//! Every read that decides something is strongly consistent: the claim's `due` index
//! queries, the order-marker queries and item reads of per-key order, `claim_ids`'
//! item reads, the admin queries, the dedup store's `contains` (`GetItem` on the base
//! table) and the entity store's `load`. Global secondary indexes are never used:
//! they are only eventually consistent.
//!
//! ## Item size
//!
//! DynamoDB items are at most 400 KB. A message item holds the payload plus about
//! 300 bytes and the headers; enqueue measures every item and refuses one over the
//! limit with [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) before
//! sending anything. The default payload limit is [`DEFAULT_MAX_PAYLOAD_BYTES`]
//! (256 KiB). A transaction holds at most 100 actions and 4 MB ([`check_transaction`]):
//! a keyed message under per-key order takes two actions. Put large bodies in S3 and
//! send a reference. For the entity store see [`DynamoEntityStore`].
//!
//! ## Picking the shard count
//!
//! Every claim queries every shard, so shards cost one query (at least 0.5 read unit)
//! each per claim; too few shards concentrate writes on few partitions. A DynamoDB
//! partition takes about 1,000 write units and 3,000 read units per second, and with
//! local indexes an item collection (one shard) is limited to 10 GB. Each message
//! costs about four writes over its life (enqueue, claim, complete, plus the index
//! entries), so take the peak messages per second × 4 ÷ 1,000, double it for headroom,
//! and keep the undelivered + dead + kept messages of a shard well under 10 GB. 4 to 16
//! shards suit most services; the default is 16. The count is fixed for the life of the
//! table: changing it strands stored messages.
//!
//! ## Global Tables
//!
//! Strong consistency holds within one region only: a strongly consistent read sees the
//! writes of its own region's replica, and concurrent writes in two regions are settled
//! by "last writer wins" after the fact, so two regions could each claim one message,
//! record one id as new, or grant one lock. [`DynamoDistributedLock::install`] and
//! [`DynamoDedupStore::install`] refuse a table that lists replicas; the outbox and
//! entity stores do not check yet. DynamoDB Local cannot create replicas, so the
//! refusal is tested on described tables, not end to end. Keep these tables in
//! one region.
//!
//! ## Limitations
//!
//! - **No storage clock.** Availability, leases and enqueue order use the clock of the
//!   process that writes. Clock skew between processes shifts leases and delays by the
//!   skew and can order two processes' enqueues of one key by their clocks rather than
//!   by commit. Keep clocks synchronised (NTP / Amazon Time Sync).
//! - **No sequence.** Enqueue order is the writing process's microsecond clock, made
//!   strictly increasing within the process.
//! - **Counts are not one snapshot.** [`OutboxAdmin::stats`](outbox_core::OutboxAdmin::stats)
//!   sums per-shard consistent queries; under traffic the figures come from slightly
//!   different moments. They read every undelivered message, so call them for
//!   monitoring, not per request.
//! - **No row locks.** DynamoDB has no transaction holding an item, so there is nothing
//!   for claims to skip; racing writers are decided by the conditional write.
//! - **Per-key order costs reads.** Each keyed candidate costs one marker query (and one
//!   item read per stale marker), and claims walk past due messages whose keys are
//!   blocked.
//! - **Requeue** puts a dead letter back at its original place in its key's order;
//!   under per-key order a keyed message and its marker go back in one
//!   `TransactWriteItems` (after one consistent read), so no claim sees it undelivered
//!   without its place. Removing a marker after a dead-letter is likewise conditional
//!   on the message (a transaction: four write units instead of one).
//! - The claim reads the `due` index in pages of up to twice the claim limit (at most
//!   1,000 entries) per shard; refused writes and blocked keys cost extra pages.

mod admin;
mod claim;
mod config;
mod dedup;
mod entity;
mod error;
mod item;
mod lock;
mod markers;
mod metrics;
mod schema;
mod settle;
mod store;

pub use config::{
    validate_table_name, DynamoDedupConfig, DynamoEntityConfig, DynamoLockConfig,
    DynamoOutboxConfig, DynamoRules, DEFAULT_MAX_PAYLOAD_BYTES, MAX_SHARDS,
};
pub use dedup::DynamoDedupStore;
pub use entity::DynamoEntityStore;
pub use item::{MAX_ITEM_BYTES, MAX_TRANSACTION_ACTIONS, MAX_TRANSACTION_BYTES};
pub use lock::{DynamoDistributedLock, DynamoLockGuard};
pub use metrics::OutboxMetrics;
pub use store::{check_transaction, DynamoOutbox};

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
        ClaimRequest, ConsumerName, DeadLetterPage, DeadLetterSelection, DedupStore, EntityKey,
        MessageId, OutboxAdmin, OutboxStore,
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
