#![doc = include_str!("../README.md")]

pub mod args;
pub mod drain;
pub mod dynamodb;
pub mod error;
pub mod message;
pub mod publish;
pub mod stats;

pub use args::{quick, selected, started_by_cargo_bench};
pub use drain::{drain_config, drain_library, ops_per_sec, run_workers, DRAIN_TIMEOUT};
pub use error::{storage, BoxError, Res};
pub use message::{order_json, order_message, stored, ORDER_DESTINATION};
pub use publish::{noop_publisher, Counting, NoopPublisher};
pub use stats::{median, median_by, ms, percentile, Figure};
