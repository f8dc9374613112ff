#![doc = include_str!("../README.md")]

mod doubles;
mod faults;
pub mod harness;
mod macros;
mod memory;
pub mod postgres;
pub mod suite;
mod support;

pub use support::{cpu, dynamodb_local, env, isolation, wait};

// `__suite_cases!`: the suites' case lists, generated from `src/suite/` by build.rs.
include!(concat!(env!("OUT_DIR"), "/suite_cases.rs"));

pub use doubles::publishers::{Gate, RecordingPublisher};
pub use doubles::recorder::TestRecorder;
pub use env::{integration_required, service_url};
pub use faults::consumer::{Crash, EventuallyConsistent, PauseAfterFirstCall, Step};
pub use faults::publisher::{assert_recovered_from_faults, FaultyPublisher, PublishFault};
pub use faults::store::{Fault, FaultyStore, Op};
pub use harness::consumer::{ConsumerHarness, MemoryConsumerHarness};
pub use harness::declared::Declared;
pub use harness::dedup::{DedupFeatures, DedupHarness, MemoryDedupHarness};
pub use harness::dedup::{LockFeatures, LockHarness, MemoryLockHarness};
pub use harness::plan::{Access, History, PlanFixture, PlanHarness, PlannedStatement, RelayOp};
pub use harness::publisher::{
    MemoryPublisherHarness, PublisherFeatures, PublisherHarness, PublisherNamespace, Received,
    RestartableNamespace,
};
pub use harness::{Features, Fixture, Harness, RowLock};
#[doc(hidden)]
pub use macros::groups::capabilities as __capabilities;
pub use memory::broker::MemoryBroker;
pub use memory::dedup::{MemoryDedupStore, MemoryLock};
pub use memory::entity::MemoryEntityStore;
pub use memory::harness::MemoryHarness;
pub use memory::store::{MemoryStore, MemoryTx};
pub use support::ports::free_port;
pub use wait::{poll_for, wait_until, within};
