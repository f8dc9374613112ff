//! # outbox-testkit
//!
//! What every outbox backend is proven with:
//!
//! - [`suite`]: the conformance suite, one `pub async fn` per behaviour of the
//!   [`OutboxStore`](outbox_core::OutboxStore) and
//!   [`OutboxAdmin`](outbox_core::OutboxAdmin) contracts and the relay engine, and
//!   [`conformance_suite!`] to turn it into one `#[tokio::test]` per case; the
//!   [`DedupStore`](outbox_core::DedupStore) and
//!   [`DistributedLock`](outbox_core::DistributedLock) suites run the same way with
//!   [`dedup_suite!`] over a [`DedupHarness`] and [`lock_suite!`] over a [`LockHarness`];
//! - [`Harness`] / [`Fixture`]: what a backend implements so the suite can make
//!   isolated stores and reach its transactions (atomic enqueue, row locks);
//! - [`MemoryStore`]: an in-memory reference store honouring the whole contract, also
//!   handy for unit-testing services; [`MemoryDedupStore`] and [`MemoryLock`];
//! - [`RecordingPublisher`]: a publisher that records, fails, slows down or rejects;
//! - the [`Publisher`](outbox_core::Publisher) suite for brokers: [`publisher_suite!`]
//!   over a [`PublisherHarness`] (a publisher into an isolated [`PublisherNamespace`] and
//!   a way to read back what the broker stored, and, for the restart case, a
//!   [`RestartableNamespace`] on a private broker the case stops and starts), proven
//!   against [`MemoryBroker`], the reference broker;
//! - [`FaultyStore`]: a store wrapper whose claims and settles fail, panic or stall on
//!   cue, for testing how relays cope;
//! - [`service_url`]: gating integration tests on a service URL, with a visible skip
//!   (or a failure under `OUTBOX_REQUIRE_INTEGRATION=1`);
//! - [`wait_until`] / [`poll_for`] / [`within`]: waiting on a condition or a future with a
//!   deadline;
//! - [`pg_cluster`]: a private PostgreSQL cluster with settings of its own, restartable,
//!   deleted on drop (needs the server binaries, not a database driver).
//!
//! ## Adding a backend
//!
//! A backend is a crate of its own that passes these suites; nothing in the core or
//! the relay changes. The steps, with the SQLite crate (`outbox-sqlite`) as the worked
//! example, since it is the smallest complete backend:
//!
//! 1. **Depend on `outbox-core` and the driver** (and `outbox-sqlx` when the driver
//!    is sqlx: it holds what the sqlx backends share), nothing else. Name the crate
//!    `outbox-<engine>` and use the same file names as the other backends: `config.rs`
//!    (settings with `with_*` setters and a `validate`), `ident.rs` (table names,
//!    checked with [`validate_identifier`](outbox_core::backend::validate_identifier)
//!    and always quoted), `schema.rs` (DDL and a versioned, idempotent `install`),
//!    `sql.rs` (statements built once per store), `row.rs` (rows into messages),
//!    `error.rs` (the one place driver errors become [`outbox_core::Error`]s, with
//!    transient ones retryable), `store.rs`, `admin.rs`, `dedup.rs`, `entity.rs`,
//!    `lock.rs`.
//! 2. **Implement [`OutboxStore`](outbox_core::OutboxStore)** (claim, claim by ids,
//!    complete, fail, release: what a relay needs) and then
//!    [`OutboxAdmin`](outbox_core::OutboxAdmin) (stats, dead letters, purges). Read
//!    the contract on the trait and `CONTRIBUTING.md`, which gives every method as
//!    engine-neutral SQL. Use the core's rules rather than re-deriving them:
//!    arguments arrive validated ([`ClaimRequest`](outbox_core::ClaimRequest),
//!    [`ClaimIds`](outbox_core::ClaimIds), [`Failure`](outbox_core::Failure) with its
//!    error already bounded); [`Settled::reconcile`](outbox_core::Settled::reconcile)
//!    turns "ids the statement touched" into applied and lost leases;
//!    [`Message::check_stored`](outbox_core::Message::check_stored) decides which
//!    claimed rows are poison; [`Headers`](outbox_core::Headers) converts to and from
//!    JSON.
//! 3. **Offer `enqueue` on the driver's own transaction** (`&mut SqliteConnection`
//!    there, `&mut PgConnection` for PostgreSQL): enqueueing is not part of the traits
//!    because it must share the caller's transaction. Check the batch with
//!    [`backend::check_enqueue`](outbox_core::backend::check_enqueue) first, and report
//!    stored ids with [`Error::already_stored`](outbox_core::Error::already_stored); a
//!    refused batch writes nothing and, where the engine allows, leaves the caller's
//!    transaction usable (SQLite uses a savepoint).
//! 4. **Run the suites from `tests/`.** Implement [`Harness`] and [`Fixture`] over a
//!    fresh database, schema, table or key prefix per fixture, declare in [`Features`]
//!    what the engine supports, and invoke [`conformance_suite!`], naming what it
//!    lacks: SQLite has no row locks and does not renew leases, so `row_locks` is off
//!    and it invokes `conformance_suite!(harness; lacks(row_locks, lease_renewal))`.
//!    This is SQLite's harness, minus the in-memory variant:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use outbox_core::{MessageId, NewMessage, OutboxAdmin, OutboxStore, Result, StoreCapabilities};
//! use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};
//! use outbox_testkit::{Features, Fixture, Harness};
//!
//! struct SqliteHarness;
//!
//! #[async_trait::async_trait]
//! impl Harness for SqliteHarness {
//!     fn features(&self) -> Features {
//!         let mut features = Features::all();
//!         features.row_locks = false; // one writer holds the whole database
//!         features
//!     }
//!
//!     async fn fixture(&self, caps: StoreCapabilities) -> Result<Box<dyn Fixture>> {
//!         // A database of its own per case (a server-backed engine would create a
//!         // schema or a uniquely named table instead).
//!         let pool = outbox_sqlite::open_in_memory().await?;
//!         let config = SqliteOutboxConfig::default()
//!             .with_ordering(caps.ordering)
//!             .with_retention(caps.retention);
//!         let outbox = SqliteOutbox::new(pool, config)?;
//!         outbox.install().await?;
//!         Ok(Box::new(SqliteFixture(outbox)))
//!     }
//! }
//!
//! #[derive(Debug)]
//! struct SqliteFixture(SqliteOutbox);
//!
//! fn storage(e: outbox_sqlite::sqlx::Error) -> outbox_core::Error {
//!     outbox_core::Error::new(outbox_core::ErrorKind::Storage, "test plumbing").with_source(e)
//! }
//!
//! #[async_trait::async_trait]
//! impl Fixture for SqliteFixture {
//!     fn store(&self) -> Arc<dyn OutboxStore> {
//!         Arc::new(self.0.clone())
//!     }
//!     fn admin(&self) -> Arc<dyn OutboxAdmin> {
//!         Arc::new(self.0.clone())
//!     }
//!     /// The backend's enqueue, in a transaction that commits.
//!     async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
//!         let mut tx = self.0.pool().begin_with("BEGIN IMMEDIATE").await.map_err(storage)?;
//!         self.0.enqueue(&mut tx, &messages).await?;
//!         tx.commit().await.map_err(storage)
//!     }
//!     /// The same, rolled back: the suite checks that nothing stays.
//!     async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
//!         let mut tx = self.0.pool().begin_with("BEGIN IMMEDIATE").await.map_err(storage)?;
//!         self.0.enqueue(&mut tx, &messages).await?;
//!         tx.rollback().await.map_err(storage)
//!     }
//!     /// Stamp a row dispatched as another tool might (the suite checks a dead letter
//!     /// stamped so is still requeued whole).
//!     async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
//!         let sql = format!(
//!             "UPDATE {} SET dispatched_at = 1 WHERE id = ?1",
//!             self.0.table_name()
//!         );
//!         outbox_sqlite::sqlx::query(&sql)
//!             .bind(id.as_uuid().as_bytes().to_vec())
//!             .execute(self.0.pool())
//!             .await
//!             .map(drop)
//!             .map_err(storage)
//!     }
//! }
//!
//! async fn harness() -> Option<SqliteHarness> {
//!     // A server-backed engine gates on its URL, printing a visible skip without one:
//!     // let url = outbox_testkit::service_url("MY_BACKEND_URL", "my backend conformance")?;
//!     Some(SqliteHarness)
//! }
//!
//! outbox_testkit::conformance_suite!(harness; lacks(row_locks, lease_renewal));
//! # fn main() {}
//! ```
//!
//! 5. **The consumer side:** a strongly consistent [`DedupStore`](outbox_core::DedupStore)
//!    runs [`dedup_suite!`] over a [`DedupHarness`] (which also needs a
//!    [`DistributedLock`](outbox_core::DistributedLock) for purges, checked by
//!    [`lock_suite!`] over a [`LockHarness`]); an
//!    [`EntityStore`](outbox_core::consumer::EntityStore) runs [`consumer_suite!`] over
//!    a [`ConsumerHarness`]. `outbox-sqlite/tests/consumer_conformance.rs` runs all
//!    three from one harness type.
//! 6. **Plans, where the engine has a planner:** implement [`PlanHarness`] and
//!    [`PlanFixture`] (bulk-load history without statistics, return the plans of what
//!    each [`RelayOp`] sends as [`Access`] steps) and invoke [`plan_suite!`]. It fails
//!    when a relay statement scans the outbox table on a table with history, or when a
//!    settle reaches its rows other than by key: every other suite passes with such a
//!    plan, because the rows are few. `outbox-sqlite/tests/conformance.rs` (SQLite's
//!    `EXPLAIN QUERY PLAN`) and `outbox-postgres/tests/postgres/plan_suite.rs`
//!    (captured prepared statements, custom and generic plans) implement it.
//! 7. **Then what only your engine can get wrong**, in a test file of its own: the
//!    caller's transaction (a refused batch leaves it usable), rows another tool wrote
//!    (dead-lettered, not stuck), several processes at once, the engine's lock or busy
//!    errors mapped to retryable kinds, installs at another layout version refused.
//! 8. **Wire it in:** a feature of the `outbox` facade re-exporting the crate (and
//!    `scripts/check-features.sh` extended), the service started by
//!    `scripts/services.sh` if it needs one, and a row in the README's backend matrix.
//!
//! Each case makes its own fixture, so cases run in parallel. The cases that need a
//! capability the suite macro was told the backend lacks (`lacks(...)`) show as
//! ignored in cargo's summary, each with the capability it needs; a case that runs and
//! finds its capability undeclared by the harness fails, so the macro call and the
//! harness cannot disagree silently.
//!
//! # Skipped suites show as ignored
//!
//! A server-backed backend gives its crate a build script that sets the cfg
//! `outbox_service_unset` when its service URL is missing at build time; every case
//! the suite macros expand then shows as `ignored`, with the reason, in cargo's own
//! summary, instead of passing after a `SKIPPED` line. Under
//! `OUTBOX_REQUIRE_INTEGRATION=1` the script fails the build instead (unless CI does
//! not run the service, as it does not run SQL Server). The
//! workspace declares the cfg (`unexpected_cfgs` in the root `Cargo.toml`). This is
//! PostgreSQL's `build.rs`:
//!
//! ```text
//! fn main() {
//!     const URL: &str = "OUTBOX_PG_URL";
//!     println!("cargo::rerun-if-env-changed={URL}");
//!     println!("cargo::rerun-if-env-changed=OUTBOX_REQUIRE_INTEGRATION");
//!     if std::env::var(URL).is_ok_and(|v| !v.trim().is_empty()) {
//!         return;
//!     }
//!     if std::env::var("OUTBOX_REQUIRE_INTEGRATION").is_ok_and(|v| v.trim() == "1") {
//!         panic!("{URL} is not set but OUTBOX_REQUIRE_INTEGRATION=1: run scripts/services.sh");
//!     }
//!     println!("cargo::warning={URL} is not set: the PostgreSQL suites are ignored");
//!     println!("cargo::rustc-cfg=outbox_service_unset");
//! }
//! ```
//!
//! Give the same attribute to the crate's own integration tests that need the service:
//! `#[cfg_attr(outbox_service_unset, ignore = "...")]`.

mod broker;
mod consumer_faults;
mod consumer_harness;
pub mod cpu;
mod dedup;
mod dedup_harness;
mod dedup_macros;
pub mod dynamodb_local;
mod entity;
pub mod env;
mod faults;
mod groups;
pub mod harness;
pub mod isolation;
mod macros;
mod memory;
mod memory_harness;
pub mod pg_cluster;
mod plan_harness;
mod plan_macros;
mod ports;
mod publisher_faults;
mod publisher_harness;
mod publisher_macros;
mod publishers;
mod recorder;
pub mod suite;
pub mod wait;

// `__suite_cases!`: the suites' case lists, generated from `src/suite/` by build.rs.
include!(concat!(env!("OUT_DIR"), "/suite_cases.rs"));

pub use broker::MemoryBroker;
pub use consumer_faults::{Crash, EventuallyConsistent, PauseAfterFirstCall, Step};
pub use consumer_harness::{ConsumerHarness, MemoryConsumerHarness};
pub use dedup::{MemoryDedupStore, MemoryLock};
pub use dedup_harness::{DedupFeatures, DedupHarness, MemoryDedupHarness};
pub use dedup_harness::{LockFeatures, LockHarness, MemoryLockHarness};
pub use entity::MemoryEntityStore;
pub use env::{integration_required, service_url};
pub use faults::{Fault, FaultyStore, Op};
#[doc(hidden)]
pub use groups::capabilities as __capabilities;
pub use harness::{Features, Fixture, Harness, RowLock};
pub use memory::{MemoryStore, MemoryTx};
pub use memory_harness::MemoryHarness;
pub use plan_harness::{Access, History, PlanFixture, PlanHarness, PlannedStatement, RelayOp};
pub use ports::free_port;
pub use publisher_faults::{assert_recovered_from_faults, FaultyPublisher, PublishFault};
pub use publisher_harness::{
    MemoryPublisherHarness, PublisherFeatures, PublisherHarness, PublisherNamespace, Received,
    RestartableNamespace,
};
pub use publishers::{Gate, RecordingPublisher};
pub use recorder::TestRecorder;
pub use wait::{poll_for, wait_until, within};
