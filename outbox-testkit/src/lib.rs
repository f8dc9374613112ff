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
//! - [`FaultyStore`]: a store wrapper whose claims and settles fail, panic or stall on
//!   cue, for testing how relays cope;
//! - [`service_url`]: gating integration tests on a service URL, with a visible skip
//!   (or a failure under `OUTBOX_REQUIRE_INTEGRATION=1`);
//! - [`wait_until`] / [`poll_for`] / [`within`]: waiting on a condition or a future with a
//!   deadline.
//!
//! ## Adding a backend
//!
//! In the backend crate's `tests/conformance.rs`, implement [`Harness`] and [`Fixture`]
//! over a fresh schema / table / key prefix per fixture, then invoke the macro. Here
//! the "backend" is the in-memory store; a real one would connect to its server
//! (with the URL from [`service_url`]) and create a schema in `fixture`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use outbox_core::{NewMessage, OutboxAdmin, OutboxStore, Result, StoreCapabilities};
//! use outbox_testkit::{Features, Fixture, Harness, MemoryStore};
//!
//! struct MyHarness;
//!
//! #[async_trait::async_trait]
//! impl Harness for MyHarness {
//!     fn features(&self) -> Features {
//!         Features::default() // declare what your backend supports
//!     }
//!     async fn fixture(&self, caps: StoreCapabilities) -> Result<Box<dyn Fixture>> {
//!         Ok(Box::new(MyFixture(MemoryStore::with_capabilities(caps))))
//!     }
//! }
//!
//! #[derive(Debug)]
//! struct MyFixture(MemoryStore);
//!
//! #[async_trait::async_trait]
//! impl Fixture for MyFixture {
//!     fn store(&self) -> Arc<dyn OutboxStore> {
//!         Arc::new(self.0.clone())
//!     }
//!     fn admin(&self) -> Arc<dyn OutboxAdmin> {
//!         Arc::new(self.0.clone())
//!     }
//!     async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
//!         self.0.enqueue(&messages) // your backend's enqueue, in a committed transaction
//!     }
//! }
//!
//! async fn harness() -> Option<MyHarness> {
//!     // let url = outbox_testkit::service_url("MY_BACKEND_URL", "my backend conformance")?;
//!     Some(MyHarness)
//! }
//!
//! outbox_testkit::conformance_suite!(harness);
//! # fn main() {}
//! ```
//!
//! Each case makes its own fixture, so cases run in parallel. Cases for features a
//! backend does not declare in [`Features`] print a `SKIPPED` line and pass.

mod consumer_faults;
mod consumer_harness;
mod dedup;
mod dedup_harness;
mod dedup_macros;
mod entity;
pub mod env;
mod faults;
pub mod harness;
mod macros;
mod memory;
mod memory_harness;
mod publishers;
pub mod suite;
pub mod wait;

pub use consumer_faults::{Crash, EventuallyConsistent, PauseAfterFirstCall, Step};
pub use consumer_harness::{ConsumerHarness, MemoryConsumerHarness};
pub use dedup::{MemoryDedupStore, MemoryLock};
pub use dedup_harness::{DedupFeatures, DedupHarness, MemoryDedupHarness};
pub use dedup_harness::{LockFeatures, LockHarness, MemoryLockHarness};
pub use entity::MemoryEntityStore;
pub use env::{integration_required, service_url};
pub use faults::{Fault, FaultyStore, Op};
pub use harness::{Features, Fixture, Harness, RowLock};
pub use memory::{MemoryStore, MemoryTx};
pub use memory_harness::MemoryHarness;
pub use publishers::{Gate, RecordingPublisher};
pub use wait::{poll_for, wait_until, within};
