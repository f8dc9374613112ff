#![doc = include_str!("../README.md")]
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # async fn demo() -> outbox::Result<()> {
//! use outbox::sqlite::{open_in_memory, SqliteOutbox, SqliteOutboxConfig};
//! use outbox::NewMessage;
//!
//! let pool = open_in_memory().await?;
//! let store = SqliteOutbox::new(pool.clone(), SqliteOutboxConfig::default())?;
//! store.install().await?;
//! let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
//! store
//!     .enqueue(&mut tx, &[NewMessage::builder("orders.created").build()?])
//!     .await?;
//! tx.commit().await.expect("commit");
//! # Ok(()) }
//! ```

// What a service uses, by name: the same root as `outbox_core`'s, and its user-facing
// modules. The backend kit (`outbox_core::backend`) is for crates that implement a
// backend, which depend on `outbox-core` itself.
pub use outbox_core::{
    admin, consumer, dedup, error, lock, message, monitor, names, publisher, purge, relay, retry,
    schema, store,
};
pub use outbox_core::{
    ClaimMode, Consistency, ConsumerName, DeadLetter, DeadLetterFilter, DeadLetterOrder,
    DeadLetterPage, DeadLetterSelection, Dedup, DedupStore, DispatchReport, DistributedLock,
    EntityKey, Error, ErrorKind, ErrorStatus, Headers, KeyOrder, LockName, Message, MessageId,
    MessageLimits, NewMessage, NewMessageBuilder, OutboxAdmin, OutboxStats, OutboxStore,
    PublishOutcome, Publisher, PurgeRun, Purger, Relay, RelayConfig, RelayHandle, Report, Result,
    Retention, RetryPolicy, StatsReporter, Wakeup,
};

/// W3C trace context through the outbox (feature `otel`).
#[cfg(feature = "otel")]
pub use outbox_core::otel;

/// The embedded SQLite backend (feature `sqlite`, on by default).
#[cfg(feature = "sqlite")]
pub use outbox_sqlite as sqlite;

/// The PostgreSQL backend (feature `postgres`).
#[cfg(feature = "postgres")]
pub use outbox_postgres as postgres;

/// The MySQL / MariaDB backend (feature `mysql`).
#[cfg(feature = "mysql")]
pub use outbox_mysql as mysql;
/// The log-tailing relay for PostgreSQL (feature `postgres-wal`): messages enqueued as
/// logical decoding messages and streamed from a replication slot. See the crate docs
/// for when to choose it over the polling relay.
#[cfg(feature = "postgres-wal")]
pub use outbox_postgres_wal as postgres_wal;

/// The SQL Server backend (feature `sqlserver`).
#[cfg(feature = "sqlserver")]
pub use outbox_sqlserver as sqlserver;

/// The DynamoDB backend (feature `dynamodb`).
#[cfg(feature = "dynamodb")]
pub use outbox_dynamodb as dynamodb;

/// The log-tailing relay for DynamoDB (feature `dynamodb-streams`): messages written
/// once as immutable items and read from the table's stream. See the crate docs for
/// when to choose it over the polling `DynamoOutbox`.
#[cfg(feature = "dynamodb-streams")]
pub use outbox_dynamodb_streams as dynamodb_streams;

/// The NATS JetStream publisher (feature `nats`).
#[cfg(feature = "nats")]
pub use outbox_nats as nats;

/// The RabbitMQ publisher (feature `rabbitmq`).
#[cfg(feature = "rabbitmq")]
pub use outbox_rabbitmq as rabbitmq;

/// The Amazon SQS publisher (feature `sqs`).
#[cfg(feature = "sqs")]
pub use outbox_sqs as sqs;

/// Conformance suites and fault-injecting tools (feature `testkit`).
#[cfg(feature = "testkit")]
pub use outbox_testkit as testkit;
