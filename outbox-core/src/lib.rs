#![doc = include_str!("../README.md")]

pub mod admin;
pub mod backend;
mod backoff;
mod bounds;
pub mod consumer;
pub mod dedup;
pub mod error;
mod headers;
mod limits;
pub mod lock;
pub mod message;
mod message_parts;
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

// The root is what a service uses: messages, the relay, consumers' stores, config,
// errors, and the store traits it passes around. Contract plumbing (claims, leases,
// settles) stays under `store`, tools' traits under their modules, and what backend
// authors need under `backend`; `tests/public_names.rs` lists this surface.
pub use admin::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, DeadLetterSelection,
    OutboxAdmin, OutboxStats,
};
pub use dedup::{Consistency, Dedup, DedupStore};
pub use error::{Error, ErrorKind, ErrorStatus, Report, Result};
pub use lock::DistributedLock;
pub use message::{Headers, Message, MessageId, MessageLimits, NewMessage, NewMessageBuilder};
pub use monitor::StatsReporter;
pub use names::{ConsumerName, EntityKey, LockName};
pub use publisher::{PublishOutcome, Publisher};
pub use purge::{PurgeRun, Purger};
pub use relay::{DispatchReport, Relay, RelayConfig, RelayHandle, Wakeup};
pub use retry::RetryPolicy;
pub use store::{ClaimMode, KeyOrder, OutboxStore, Retention};
