//! A throwaway storage backend, written by following `CONTRIBUTING.md` and the
//! `outbox-testkit` walk-through from scratch, to show what a backend crate needs
//! around its engine: its files and how few lines each takes when the engine is
//! given. The "engine" here is the testkit's in-memory reference store
//! ([`MemoryStore`](outbox_testkit::MemoryStore)), so everything engine-specific (SQL,
//! row decoding, the error table) is absent; what remains is the backend's shape: a
//! validated config, an `enqueue` on the engine's own transaction, the store and admin
//! traits, the consumer-side stores, and one `tests/conformance.rs` that runs every
//! shared suite with `outbox_testkit::backend_suites!`.
//!
//! Run its suites: `cargo test -p example-toy-backend`.

mod admin;
mod config;
mod consumer;
mod store;

pub use config::ToyOutboxConfig;
pub use consumer::{ToyDedupStore, ToyDistributedLock, ToyEntityStore};
pub use store::{ToyOutbox, ToyTx};
