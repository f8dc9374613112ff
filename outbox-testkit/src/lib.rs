#![doc = include_str!("../README.md")]

mod backend_macros;
mod broker;
mod consumer_faults;
mod consumer_harness;
pub mod cpu;
mod declared;
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
mod service_test;
pub mod suite;
pub mod wait;

// `__suite_cases!`: the suites' case lists, generated from `src/suite/` by build.rs.
include!(concat!(env!("OUT_DIR"), "/suite_cases.rs"));

pub use broker::MemoryBroker;
pub use consumer_faults::{Crash, EventuallyConsistent, PauseAfterFirstCall, Step};
pub use consumer_harness::{ConsumerHarness, MemoryConsumerHarness};
pub use declared::Declared;
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
