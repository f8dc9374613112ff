//! # outbox-core
//!
//! The database-free heart of the transactional outbox and inbox: the message model,
//! the contracts storage backends implement, the relay engine that moves messages to a
//! broker, and the retry policy.
//!
//! ## How the pieces fit
//!
//! 1. A service writes business rows **and** [`NewMessage`]s in one database
//!    transaction. Enqueueing is backend-specific because it takes the driver's own
//!    transaction type (for example `outbox_postgres::PgOutbox::enqueue(&mut *tx, ..)`); it never
//!    commits on the caller's behalf.
//! 2. A [`Relay`] claims due messages from an [`OutboxStore`] under a lease with a
//!    fencing token, publishes them through a [`Publisher`], and completes or fails
//!    them (retry with backoff, then dead-letter).
//! 3. Consumers record processed ids in a [`DedupStore`] so broker redeliveries and
//!    at-least-once publishing do not apply a message twice: in their own transaction
//!    (a backend's inbox), or with the decoupled algorithm of [`consumer`]
//!    ([`consumer::DecoupledConsumer`]) when the state lives elsewhere.
//! 4. Singleton housekeeping (purging history) runs under a [`DistributedLock`].
//!
//! ## The claim protocol
//!
//! 1. **Claim** in one atomic step: select due messages, skipping (never waiting on)
//!    rows another claimer holds; stamp each with a lease expiry by the storage's clock
//!    and a fresh [`LeaseToken`]; increment `attempts`; return them.
//! 2. **Publish** outside any database transaction.
//! 3. **Settle** with the lease: [`OutboxStore::complete`], [`OutboxStore::fail`] or
//!    [`OutboxStore::release`] match on id *and* token, so a relay whose lease lapsed and
//!    whose message was claimed by another cannot change the new owner's claim; it learns
//!    so through [`Settled::lost`] ([`ErrorKind::LeaseLost`] in the single-message
//!    helpers).
//! 4. A crashed relay's leases simply expire and the messages become due again.
//!
//! ## Writing a backend
//!
//! A backend crate provides:
//!
//! - an `enqueue` function taking the driver's transaction, checking the batch with
//!   [`backend::check_enqueue`] before writing (every message against the
//!   [`MessageLimits`], no id twice), and writing all of a batch or none; an id already
//!   stored is an [`ErrorKind::Conflict`] naming the ids;
//! - a type implementing [`OutboxStore`] (what a relay needs) and [`OutboxAdmin`] (what
//!   an operator needs) that honours every point of their `# Contract`s;
//! - optionally [`DedupStore`] and [`DistributedLock`] implementations;
//! - one function in its `error.rs` mapping driver errors to [`Error`] with the right
//!   [`ErrorKind`] and retryable status;
//! - tests running `outbox-testkit`'s suites against a real server.
//!
//! The repository's `CONTRIBUTING.md` gives the data model and each method as
//! engine-neutral SQL, and names the helpers here to call instead of copying: validated
//! names ([`ConsumerName`], [`LockName`], [`backend::validate_identifier`]), headers as
//! JSON ([`Headers::to_json`]), [`backend::MessageParts`], [`Message::check_stored`],
//! [`Failure::new`], [`backend::in_id_order`]. Most of what a backend author needs and
//! a user does not lives in [`backend`]; the rest are constructors and helpers on the
//! contract's own types (such as [`Settled::reconcile`]).
//!
//! ## Guarantees and limits
//!
//! Publishing is **at-least-once**. A message can be published twice when a relay dies
//! after the broker accepted it but before completing, when a publish outlives its
//! lease, or when shutdown abandons a publish in flight. Publishers pass the message id
//! as the broker's dedup id where one exists, and consumers deduplicate with a
//! [`DedupStore`].
//!
//! ## Trace propagation
//!
//! With the cargo feature `otel` (off by default) a trace crosses the outbox in the
//! message headers, as W3C Trace Context:
//!
//! 1. [`NewMessageBuilder::build`] writes the current `tracing` span's OpenTelemetry
//!    context as `traceparent` / `tracestate` headers (never over headers the caller
//!    set, never past the [`MessageLimits`]);
//! 2. the relay's `outbox.publish` span, one per publish call, links to every
//!    message's producer context, so a trace backend joins the relay's work to the
//!    producers' traces;
//! 3. consumers continue the trace with `otel::context_of` / `otel::context_of_headers`
//!    as the parent of their processing span.
//!
//! The `otel` module documents the rules and limitations. It needs a
//! `tracing-opentelemetry` layer in the service's subscriber; without one nothing is
//! written.

pub mod admin;
pub mod backend;
mod backoff;
pub mod consumer;
pub mod dedup;
pub mod error;
mod headers;
mod limits;
pub mod lock;
pub mod message;
pub mod monitor;
pub mod names;
#[cfg(feature = "otel")]
pub mod otel;
pub mod publisher;
pub mod purge;
pub mod relay;
pub mod retry;
pub mod schema;
pub mod store;

pub use admin::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, DeadLetterSelection,
    OutboxAdmin, OutboxStats,
};
pub use dedup::{Consistency, Dedup, DedupStore};
pub use error::{Error, ErrorKind, ErrorStatus, Report, Result};
pub use lock::{DistributedLock, LockGuard};
pub use message::{Headers, Message, MessageId, MessageLimits, NewMessage, NewMessageBuilder};
pub use monitor::StatsReporter;
pub use names::{ConsumerName, EntityKey, LockName};
pub use publisher::{OutcomeCounts, PublishOutcome, Publisher};
pub use purge::{PurgeRun, Purger};
pub use relay::{
    DispatchReport, Relay, RelayConfig, RelayHandle, Wakeup, DEFAULT_PIPELINE_DEPTH,
    MAX_PIPELINE_DEPTH,
};
pub use retry::RetryPolicy;
pub use schema::Schema;
pub use store::{
    ClaimIds, ClaimMode, ClaimRequest, Claimed, ClaimedMessage, Disposition, Failure, KeyOrder,
    Lease, LeaseToken, OutboxStore, OutboxStoreExt, Renewed, Retention, Settled, SettledAndClaimed,
    Settlement, StoreCapabilities,
};
