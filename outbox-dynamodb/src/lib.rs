//! # outbox-dynamodb
//!
//! DynamoDB backend for the transactional outbox, on `aws-sdk-dynamodb`:
//!
//! - [`DynamoOutbox`]: an [`OutboxStore`](outbox_core::OutboxStore) and
//!   [`OutboxAdmin`](outbox_core::OutboxAdmin). Enqueue joins your own
//!   `TransactWriteItems` ([`DynamoOutbox::enqueue_writes`], or
//!   [`DynamoOutbox::enqueue`] to send your writes and the messages in one
//!   transaction). Each message is a small state item (what claims and settles write)
//!   and a body written once; relays find due messages through a write-sharded global
//!   secondary index and claim each with one conditional write on its state item.
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
//! outbox.install().await?; // on-demand table with its global indexes, once
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
//! ## Table layout (outbox, layout version 2)
//!
//! One table, string keys `pk` (partition) and `sk` (sort), on-demand billing, time to
//! live on the attribute `ttl`, **no local secondary index**.
//!
//! | item | `pk` | `sk` | attributes | written |
//! |---|---|---|---|---|
//! | state | `m#<id>` (the id hyphenated lowercase) | `s` | `shard` (`q#<n>`, n = FNV-1a of the id mod shard count), `destination`, `pkey` (partition key), `created_us`, `avail_us`, `seq`, `attempts`, `parts`, `token`, `last_error`, `due`, `dead_id`, `dead_us`, `done_us`, `body_exp` (the body's `ttl` as last written) | at enqueue, by every claim and settle |
//! | body | `m#<id>` | `b#000`, `b#001`, ... | `payload` (binary, at most 300 KiB per item), `headers` (JSON text) and `ctype` on the first, `ttl` (epoch seconds) | once, at enqueue; afterwards only `ttl`, for messages that wait long (below) |
//! | order marker (per-key order only) | `k#<shard of the partition key>` | `<key byte length>:<key>#<seq, 16 digits>#<id>` | `mid` (the message id) | at enqueue; deleted when the message leaves |
//!
//! The state item is under 1 KB whatever the payload (about 200 bytes plus the
//! destination, key and last error), so every claim, settle, renewal of the due time,
//! dead-lettering and requeue costs the same capacity for a 1 KB and a 100 KB message.
//! A payload over 300 KiB is split over several body items (the split layout): a
//! message can carry up to the 4 MB transaction limit (raise
//! [`MessageLimits`](outbox_core::MessageLimits)' payload limit, default
//! [`DEFAULT_MAX_PAYLOAD_BYTES`]); no body is carried inline in the state item.
//!
//! Discovery is three sparse **global** secondary indexes, all with partition key
//! `shard` (the write sharding: one index partition per shard value) and only state
//! items in them:
//!
//! | index | sort key | present while | projection | serves |
//! |---|---|---|---|---|
//! | `due` | `due` = `avail_us` × 10¹⁶ + `seq` (number) | undelivered | `attempts`, `pkey`, `token`, `created_us`, `avail_us` | claims (oldest availability, then enqueue order), stats |
//! | `dead` | `dead_id` = the id | dead-lettered | all (of the small state item) | dead-letter listing in id order, counts |
//! | `done` | `done_us` | dispatched under `Retention::Keep` | keys | bounded purges, counts |
//!
//! `avail_us` doubles as the lease expiry while a message is leased; `token` is the
//! current lease's fencing token. Delivered messages leave the `due` index (their state
//! item is deleted under `Retention::Delete`), so claims never read history.
//!
//! **No size cap on the business write.** Every message has its own partition key, and
//! there is no local secondary index, so there are no item collections and no 10 GB
//! limit any enqueue could run into: backlog, dead letters and kept history grow with
//! the table. Global indexes have no collection limit either; what a hot index
//! partition can do is throttle, which [`DynamoOutbox::enqueue`] reports as
//! [`ErrorKind::Contention`](outbox_core::ErrorKind::Contention) (retryable) and which
//! more shards avoid.
//!
//! **Bodies expire by time to live, not by deletes.** DynamoDB bills a delete at the
//! size of the deleted item, and TTL deletes for free, so completing a message deletes
//! only its state item and leaves the body to TTL:
//! [`body_ttl`](DynamoOutboxConfig::with_body_ttl) after its availability (default 14
//! days). Bodies of delivered messages cost storage until TTL deletes them (payload ×
//! rate × `body_ttl`). Dead-lettering removes a body's time to live (a dead letter
//! keeps its body until discarded); a requeue sets it again.
//!
//! **Bodies of undelivered messages are renewed.** With `T` = `body_ttl`, the state
//! item records the body's expiry (`body_exp`, epoch seconds; in no index projection,
//! so the layout is unchanged):
//!
//! 1. Every write that sets a message's availability keeps its body's expiry at least
//!    ¾ `T` past it: enqueue and requeue write availability + `T`; a claim (the
//!    availability is then the lease expiry), a retry (the end of its backoff) and a
//!    release that find less renew the body to availability + `T`.
//! 2. Every [`body_sweep_every`](DynamoOutboxConfig::with_body_sweep_every) (default
//!    `T`/8), one of a store's claims starts a sweep in the background (one at a time
//!    per store; the claim does not wait for it, so it takes nothing from the relay's
//!    claim allowance). It walks the `due` index of each shard the store claims from
//!    (with shard leases, the shards it holds; without, every shard), oldest first.
//!    The first entry (one read) gives how long the oldest due message has waited,
//!    published as [`OutboxMetrics::oldest_due_age`] (so refreshed once per interval
//!    per shard). Entries more than `T`/4 old are the messages waiting long (keys
//!    blocked behind a head that keeps retrying, a backlog far behind, messages put
//!    back by a release or requeue), normally none. For each, the state item is read
//!    (eventually consistent, `body_exp` and `parts` only); a body with less than
//!    `T`/2 left gets every body item's `ttl` set to now + `T`, and then `body_exp`. A
//!    message whose renewal fails is logged and counted
//!    ([`OutboxMetrics::body_sweep_errors`]) and the pass goes on; a shard whose query
//!    fails is tried again a minute later from where its pass stood. One step looks
//!    at no more than 100 such messages (starting from a different shard each step)
//!    and leaves the rest to the next claim's step. [`OutboxMetrics::last_body_sweep`]
//!    is when the stalest shard's last completed pass began.
//!    [`DynamoOutbox::renew_bodies`] sweeps at once.
//!
//! What this guarantees: while at least one relay claims (polling counts), every
//! shard is swept every interval and **no body of an undelivered message expires**. If
//! no relay runs (or every sweep fails) for longer than `T`/2 minus the sweep interval
//! (3`T`/8 by default: 5¼ of 14 days), messages that were already waiting can lose
//! their bodies; such a message is dead-lettered by the claim that finds it, naming
//! the missing body. **Choose `body_ttl` so that half of it minus the sweep interval
//! exceeds your longest relay outage**, or run [`DynamoOutbox::renew_bodies`] from a
//! maintenance job during a planned one. A relay stuck in a publish does not claim and
//! so does not sweep. A renewal only pushes `ttl` out, and only on body items that
//! still have one, so a renewal racing a dead-lettering never gives the dead letter's
//! body a time to live back; and only on items whose `ttl` is below the renewal's need
//! (now + `T`/2 for the sweep, availability + ¾ `T` for the writes of 1.), so of two
//! renewers racing, the second is refused instead of writing the body again.
//! DynamoDB bills a refused conditional write at the item's size too: the condition
//! saves the second write, not its cost (the state read before it makes such races
//! rare).
//!
//! What it costs: a sweep finding nothing is one index read per shard per interval
//! per store that sweeps it: with shard leases each shard has one owner, so about one
//! per shard; without them every store sweeps every shard, so one per shard per
//! relay. Each message waiting longer than `T`/4 costs one state read (eventually
//! consistent: half a unit) per sweep of its shard, by the same count, and each
//! renewal (about every `T`/2 per waiting message) rewrites every body item, **billed
//! at the body's size** (⌈`P`⌉ write units for a `P` KB body), plus one write unit for
//! `body_exp`. A claim of a message that became available more than about `T`/4
//! earlier renews its body too, so draining a backlog that far behind pays one body
//! write per message. [`OutboxMetrics::bodies_renewed`] and
//! [`OutboxMetrics::body_renewal_units`] count them.
//!
//! ## Claim protocol
//!
//! 1. Query the `due` index of every shard this store claims from (concurrently,
//!    **eventually consistent**, `due < (now + 1 µs) × 10¹⁶`, ascending) and merge the
//!    pages: oldest availability first, then enqueue order, across shards. A shard's
//!    first page is its share of the claim plus 2 entries; each further page of one
//!    claim is twice as long (up to 1,000), so a claim reads about what it takes, and
//!    one walking past blocked keys needs few round trips.
//! 2. Under [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), a keyed candidate must
//!    be its key's head: the first order marker of the key (strongly consistent query,
//!    `Limit = 1`) must name it. A marker whose message is no longer undelivered (a
//!    crash between settle and marker removal) is removed there and then, by a
//!    `TransactWriteItems` of a condition check on the state item and the marker delete:
//!    a requeue committed meanwhile keeps its marker.
//! 3. For each candidate, one `UpdateItem` of the state item with the condition
//!    `attribute_exists(due) AND avail_us <= :now AND attempts < :max` sets a fresh
//!    token, `avail_us = now + lease`, adds one attempt, and returns the state. The
//!    conditional write is the claim, and it reads the item itself, so an index entry
//!    that is stale (the index lags the table) costs at most a refused write, never a
//!    double claim. Entries this store claimed in the last five seconds are skipped, so
//!    its own claims' lag does not come back as refused writes.
//! 4. The body is read once (a query of `pk = m#<id>`, eventually consistent, again
//!    strongly consistent if parts are missing). A state and body that do not make a
//!    valid message (undecodable headers, a payload over the configured limit, a
//!    missing body) are dead-lettered under the new lease, and the claim goes on.
//! 5. A refused write shows the shard's page is stale (another relay took the message):
//!    the shard is read again, and for the next second this store's claims draw each
//!    batch at random from the oldest four times as many candidates as wanted (the
//!    batch is still returned in due order).
//! 6. A request that fails for another reason (throttled past the SDK's retries, timed
//!    out) fails only its message: the claim finishes its round and returns what it
//!    took, and returns the error only when it took nothing. A message whose claim
//!    write failed is left to the lease that write may have set (after a timeout it may
//!    have landed); one whose body read failed after its write is released at once.
//!    Both are counted in [`OutboxMetrics::claim_errors`].
//!
//! Complete, fail and release are conditional writes on the state item,
//! `token = :token AND attribute_exists(due)`; a refused one is a lost lease, reported
//! in [`Settled::lost`](outbox_core::Settled::lost). Under `Retention::Delete` without
//! per-key order, completes travel 25 to a request as PartiQL `BatchExecuteStatement`
//! deletes of state items with the same condition: each statement is its own
//! conditional write, so a lost lease fails alone. A PartiQL `DELETE` of a key that no
//! longer exists succeeds with nothing deleted (only an existing item failing the
//! condition is refused), so each statement returns the item it deleted
//! (`RETURNING ALL OLD *`) and one that deleted nothing is reported lost: the message
//! was completed under a later lease. A settle that fails for another reason stops
//! none of the others of its call: every lease is attempted, then the call returns the
//! error (counted in [`OutboxMetrics::settle_errors`]) so the relay retries it, and the
//! retry reports the leases the first try applied as lost.
//!
//! ## Relays divide the shards (shard leases)
//!
//! With [`with_shard_leases`](DynamoOutboxConfig::with_shard_leases) (on by default,
//! 10-second leases) every store (each [`DynamoOutbox::new`], not each clone) is a
//! worker, as in the Kinesis Client Library: it heartbeats an item `pk = w`,
//! `sk = <worker id>`, holds lease items `pk = l`, `sk = <shard>` (`owner`, `counter`,
//! `expires_us`) on about ⌈shards ÷ live workers⌉ shards, renews them with conditional
//! writes every third of the lease, takes free and lapsed leases, and steals from the
//! most loaded worker while that one holds more than its share. Its claims read only the
//! shards it holds, so in steady state relays do not meet each other's messages and
//! refuse no writes. A worker that dies stops renewing; its leases lapse and the others
//! take its shards (nothing is lost: its claimed messages come back when their message
//! leases lapse). [`DynamoOutbox::release_shards`] hands a worker's shards over at once
//! on shutdown. Run one store per relay process; with more relays than shards the extra
//! ones stand by. Stealing is decided by the lease's conditional write; until the old
//! owner's next renewal both may claim from the shard, which costs refused writes, not
//! correctness. A maintenance round costs one heartbeat write, two strongly consistent
//! queries and one write per held lease.
//!
//! ## Capacity per message (design minimum)
//!
//! A write unit covers 1 KB, a strongly consistent read unit 4 KB (an eventually
//! consistent one 8 KB); transactional writes cost double; an index entry written or
//! deleted costs one more write unit, and moving an entry (its sort key changes) costs
//! two. With a state item under 1 KB and a body of `P` KB:
//!
//! | operation | writes | write units | read units |
//! |---|---|---|---|
//! | enqueue (in your transaction) | put state + `due` entry, put body | 2 + 1 + 2 × ⌈P + 0.1⌉ | 0 |
//! | claim | update state, move `due` entry | 1 + 2 = **3** | index page share + ⌈P / 4⌉ / 2 for the body |
//! | complete (`Delete`) | delete state, delete `due` entry | 1 + 1 = **2** | 0 |
//! | fail with retry / release | update state, move `due` entry | **3** | 0 |
//! | dedup record | conditional put | 1 | 0 |
//! | body renewal (messages waiting long only) | update each body item, update state | ⌈P⌉ + 1 | 0.5 (the sweep's state read) |
//!
//! So claim + complete costs 5 write units whatever the payload; only the enqueue and
//! the body read grow with it. A refused conditional write costs 1 write unit (the
//! state item's size). `dynamodb_bench --capacity` measures these on DynamoDB Local
//! (which reports consumed capacity for everything but PartiQL batches; for those the
//! store counts the 2 units above itself).
//!
//! ## Strongly consistent reads
//!
//! Reads that decide are strongly consistent or guarded by a conditional write: the
//! claim's index queries are eventually consistent (global indexes offer nothing else),
//! and the conditional write on the state item decides; the order-marker queries and
//! state reads of per-key order, `claim_ids`' state reads, the dedup store's `contains`
//! (`GetItem` on the base table) and the entity store's `load` are strongly
//! consistent. The admin counts and listings come from the global indexes, so they lag
//! writes by the index's propagation delay (usually well under a second on AWS). The
//! body sweep's state reads are eventually consistent, guarded by the renewal's
//! conditional writes: a stale read costs a refused write or, for a message completed
//! a moment before, one renewal of a body no longer needed (it expires `T` later).
//!
//! ## Item size
//!
//! DynamoDB items are at most 400 KB. A payload is split over body items of at most
//! 300 KiB; the first also holds the headers, and enqueue refuses a message making any
//! item over the limit with [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput)
//! before sending anything. A transaction holds at most 100 actions and 4 MB
//! ([`check_transaction`]): a message takes one action for its state, one per 300 KiB of
//! payload, and one more for its order marker when keyed under per-key order.
//!
//! ## Picking the shard count
//!
//! Shards now spread the global indexes' partitions, not the messages (which spread
//! over their own partition keys). A claim queries each shard it reads (at least 0.5
//! read unit each), and an index partition takes about 1,000 write units per second:
//! each message moves through the `due` index about four times in its life (enqueue,
//! claim, complete, plus one per retry), so take the peak messages per second × 4 ÷
//! 1,000 and double it. 4 to 16 shards suit most services; the default is 16. The count
//! is fixed for the life of the table: changing it strands stored messages.
//!
//! Too few shards show as throttles: [`OutboxMetrics::throttled`] counts every throttled
//! attempt of the store's requests (those the SDK's retries absorbed included),
//! [`OutboxMetrics::enqueue_throttled`] the throttled enqueues (alert on it: they hold
//! back the caller's business write), and [`DynamoOutbox::throttled`] breaks them down
//! by operation, index and DynamoDB's throttling reason. Throttles on the `due` index
//! (its queries, or table writes held back by it with an `IndexWrite...` reason) call
//! for more shards.
//!
//! ## Migrating from layout 1
//!
//! [`Schema::layout_version`](outbox_core::Schema::layout_version) is 2. Layout 1 kept a
//! whole message in one item under `q#<shard>` with three local secondary indexes;
//! DynamoDB cannot drop local indexes or change keys, so [`DynamoOutbox::install`]
//! refuses a layout-1 table with [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema).
//! To move: install layout 2 under a new table name; point enqueues at it (deploy
//! writers first); keep relays of the previous release on the old table until its
//! `stats` show nothing pending or in flight (and its dead letters are requeued or
//! discarded there); then delete the old table. Messages are never copied, so
//! nothing is delivered twice. The dedup store's layout 2 has its own note on
//! [`DynamoDedupStore`].
//!
//! ## Global Tables
//!
//! Strong consistency holds within one region only: a strongly consistent read sees the
//! writes of its own region's replica, and concurrent writes in two regions are settled
//! by "last writer wins" after the fact, so two regions could each claim one message,
//! record one id as new, or grant one lock. Every store's `install`
//! ([`DynamoOutbox::install`], [`DynamoDedupStore::install`],
//! [`DynamoEntityStore::install`], [`DynamoDistributedLock::install`]) refuses a table
//! whose description lists replicas with
//! [`ErrorKind::Config`](outbox_core::ErrorKind::Config); a table made global after the
//! install is not detected. DynamoDB Local cannot create replicas, so the refusal is
//! tested on described tables, not end to end. Keep these tables in one region.
//!
//! ## Testing against AWS's failures
//!
//! DynamoDB Local never throttles, never cancels a transaction for a conflict and never
//! fails one statement of a batch. With the non-default feature `fault-injection`,
//! `outbox_dynamodb::faults::FaultInjector` is an interceptor for the client's
//! configuration that injects those faults (seeded, per operation, per item, before or
//! after the request is applied) into the real requests, so the SDK's own error
//! handling and retries run as they would on AWS. The crate's tests run the store
//! under it; it is not meant for production clients.
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
//!   sums per-shard global index queries; under traffic the figures come from slightly
//!   different moments. They read every undelivered message, so call them for
//!   monitoring, not per request.
//! - **No row locks.** DynamoDB has no transaction holding an item, so there is nothing
//!   for claims to skip; racing writers are decided by the conditional write.
//! - **Per-key order costs reads.** Each keyed candidate costs one marker query (and one
//!   state read per stale marker), and claims walk past due messages whose keys are
//!   blocked.
//! - **Requeue** puts a dead letter back at its original place in its key's order;
//!   under per-key order a keyed message and its marker go back in one
//!   `TransactWriteItems` (after one consistent read), so no claim sees it undelivered
//!   without its place. Removing a marker after a dead-letter is likewise conditional
//!   on the message (a transaction: four write units instead of one).
//! - **Bodies outlive delivery** until their time to live (see above). Bodies of
//!   undelivered messages are renewed by the relays; an outage of every relay longer
//!   than half of `body_ttl` minus the sweep interval can lose the bodies of messages
//!   that were already waiting.

mod admin;
mod body;
mod claim;
mod config;
mod dedup;
mod entity;
mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod item;
mod lock;
mod markers;
mod metrics;
mod schema;
mod settle;
mod shards;
mod store;
mod sweep;
mod throttles;

pub use config::{
    validate_table_name, DynamoDedupConfig, DynamoEntityConfig, DynamoLockConfig,
    DynamoOutboxConfig, DynamoRules, DEFAULT_BODY_TTL, DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_SHARD_LEASE, MAX_SHARDS,
};
pub use dedup::DynamoDedupStore;
pub use entity::DynamoEntityStore;
pub use item::{MAX_ITEM_BYTES, MAX_TRANSACTION_ACTIONS, MAX_TRANSACTION_BYTES};
pub use lock::{DynamoDistributedLock, DynamoLockGuard};
pub use metrics::OutboxMetrics;
pub use store::{check_transaction, DynamoOutbox};
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
