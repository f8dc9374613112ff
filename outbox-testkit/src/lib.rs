//! # outbox-testkit
//!
//! What every outbox backend is proven with:
//!
//! - [`suite`]: the conformance suite, one `pub async fn` per behaviour of the
//!   [`OutboxStore`](outbox_core::OutboxStore) contract and the relay engine, and
//!   [`conformance_suite!`] to turn it into one `#[tokio::test]` per case;
//! - [`Harness`] / [`Fixture`]: what a backend implements so the suite can make
//!   isolated stores and reach its transactions (atomic enqueue, row locks);
//! - [`MemoryStore`]: an in-memory reference store honouring the whole contract, also
//!   handy for unit-testing services; [`MemoryDedupStore`] and [`MemoryLock`];
//! - [`RecordingPublisher`]: a publisher that records, fails, slows down or rejects;
//! - [`service_url`]: gating integration tests on a service URL, with a visible skip
//!   (or a failure under `OUTBOX_REQUIRE_INTEGRATION=1`).
//!
//! ## Adding a backend
//!
//! In the backend crate's `tests/conformance.rs`:
//!
//! ```ignore
//! struct PgHarness { pool: PgPool }
//!
//! #[async_trait::async_trait]
//! impl outbox_testkit::Harness for PgHarness {
//!     fn features(&self) -> outbox_testkit::Features { outbox_testkit::Features::all() }
//!     async fn fixture(&self, o: outbox_testkit::FixtureOptions)
//!         -> outbox_core::Result<Box<dyn outbox_testkit::Fixture>> {
//!         // create a fresh schema, install the table, return a fixture over it
//!     }
//! }
//!
//! async fn harness() -> Option<PgHarness> {
//!     let url = outbox_testkit::service_url("OUTBOX_PG_URL", "postgres conformance")?;
//!     Some(PgHarness { pool: PgPool::connect(&url).await.unwrap() })
//! }
//!
//! outbox_testkit::conformance_suite!(harness);
//! ```
//!
//! Each case makes its own fixture, so cases run in parallel. Cases for features a
//! backend does not declare in [`Features`] print a `SKIPPED` line and pass.

mod dedup;
pub mod env;
pub mod harness;
mod macros;
mod memory;
mod memory_harness;
mod publishers;
pub mod suite;

pub use dedup::{MemoryDedupStore, MemoryLock};
pub use env::{integration_required, service_url};
pub use harness::{Features, Fixture, FixtureOptions, Harness, RowLock};
pub use memory::{MemoryStore, MemoryTx};
pub use memory_harness::MemoryHarness;
pub use publishers::RecordingPublisher;
