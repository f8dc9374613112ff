//! What a broker's [`Publisher`] implements to run the publisher suite, and the harness
//! of the in-memory reference broker.
//!
//! The cases live in [`suite`](crate::suite) (the `publisher_*` functions) and become
//! tests through [`publisher_suite!`](crate::publisher_suite).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{Error, ErrorKind, Headers, Publisher, Result};

use crate::harness::declared::Sealed;
use crate::memory::broker::MemoryBroker;

/// What a broker under test supports, as its suite macro declares it: every capability
/// but those named in
/// [`publisher_suite!`](crate::publisher_suite)`(make; lacks(dedup_window))`. A
/// harness does not build it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherFeatures {
    /// The broker drops a repeat of a message id within a dedup window (JetStream's
    /// `Nats-Msg-Id` and its `duplicate_window`): the repeat's outcome is
    /// [`Published`](outbox_core::PublishOutcome::Published) and the broker holds the
    /// message once.
    pub dedup_window: bool,
    /// The broker tells a destination that nothing stores apart
    /// ([`PublisherNamespace::unroutable_destination`]), and the publisher reports it
    /// [`Permanent`](outbox_core::PublishOutcome::Permanent) without failing the rest of
    /// the batch.
    pub unroutable_is_permanent: bool,
    /// The harness can run a broker of its own that a case stops and starts again
    /// ([`PublisherHarness::restartable_namespace`]), to check what a publisher does
    /// while its broker restarts.
    pub broker_restart: bool,
}

impl PublisherFeatures {
    /// Everything on.
    pub fn all() -> Self {
        PublisherFeatures {
            dedup_window: true,
            unroutable_is_permanent: true,
            broker_restart: true,
        }
    }

    /// Everything but the capabilities `lacks` names (a suite macro's list).
    pub(crate) fn lacking(lacks: &[&str]) -> Self {
        let has = |name: &str| !lacks.contains(&name);
        PublisherFeatures {
            dedup_window: has("dedup_window"),
            unroutable_is_permanent: has("unroutable_is_permanent"),
            broker_restart: has("broker_restart"),
        }
    }
}

/// One message as the broker holds it, decoded by the harness from the broker's own
/// representation: the suite compares it with what was published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Received {
    /// The id the broker deduplicates on (`Nats-Msg-Id`, AMQP `message-id`), if any.
    pub dedup_id: Option<String>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The content type, wherever the publisher carried it.
    pub content_type: Option<String>,
    /// The partition key, wherever the publisher carried it.
    pub partition_key: Option<String>,
    /// The message's own headers, without the ones the publisher or the broker added
    /// (dedup id, content type, partition key, broker bookkeeping).
    pub headers: Headers,
}

impl Received {
    /// A received message with this payload and nothing else.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Received {
            dedup_id: None,
            payload: payload.into(),
            content_type: None,
            partition_key: None,
            headers: Headers::new(),
        }
    }

    /// Set the broker's dedup id.
    #[must_use]
    pub fn with_dedup_id(mut self, id: Option<String>) -> Self {
        self.dedup_id = id;
        self
    }

    /// Set the content type.
    #[must_use]
    pub fn with_content_type(mut self, content_type: Option<String>) -> Self {
        self.content_type = content_type;
        self
    }

    /// Set the partition key.
    #[must_use]
    pub fn with_partition_key(mut self, key: Option<String>) -> Self {
        self.partition_key = key;
        self
    }

    /// Set the message's own headers.
    #[must_use]
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }
}

/// A fresh, isolated part of the broker for one case (a stream and subject prefix of its
/// own, a vhost or exchange of its own), with publishers into it and a way to read back
/// what the broker stored.
#[async_trait]
pub trait PublisherNamespace: Send + Sync + fmt::Debug {
    /// A publisher into this namespace. Each call may return a new publisher with its
    /// own connection, as another relay process would hold; the suite calls it several
    /// times for its concurrency case.
    async fn publisher(&self) -> Result<Arc<dyn Publisher>>;

    /// A destination the broker stores messages for, named after `name` (a short
    /// lowercase word): different names give different destinations.
    fn destination(&self, name: &str) -> String;

    /// A well-formed destination that nothing in the broker stores or routes, so
    /// publishing to it can never succeed. Used only when
    /// [`PublisherFeatures::unroutable_is_permanent`] is declared.
    fn unroutable_destination(&self) -> String;

    /// Everything the broker holds for `destination`, in the order it stored it.
    async fn received(&self, destination: &str) -> Result<Vec<Received>>;

    /// Remove what the namespace created. Cases call it when they pass; a harness
    /// should also remove stale namespaces that failed cases left behind.
    async fn teardown(&self) -> Result<()> {
        Ok(())
    }
}

/// A namespace on a broker that belongs to one case alone, which the case may stop and
/// start again. Never the shared broker other tests use: stopping it would fail them.
#[async_trait]
pub trait RestartableNamespace: PublisherNamespace {
    /// Stop the broker abruptly, as a crash or a restart does (no goodbye to its
    /// clients), and return once it accepts no more connections.
    async fn stop_broker(&self) -> Result<()>;

    /// Start the broker again on the same address with the same storage, and return once
    /// it accepts connections. What it stored before the stop is still there.
    async fn start_broker(&self) -> Result<()>;
}

/// Hands out isolated [`PublisherNamespace`]s, one per case.
#[async_trait]
pub trait PublisherHarness: Send + Sync + 'static {
    /// What the broker supports, as its suite macro declared it; answered by
    /// [`Declared`](crate::Declared), never by a harness.
    fn features(&self, _: Sealed) -> PublisherFeatures {
        PublisherFeatures::all()
    }

    /// A fresh, empty namespace of the broker, so cases can run in parallel.
    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>>;

    /// A namespace on a private broker of its own that the case may stop and start.
    /// Called only when [`PublisherFeatures::broker_restart`] is declared; the default
    /// refuses with [`ErrorKind::Unsupported`].
    async fn restartable_namespace(&self) -> Result<Box<dyn RestartableNamespace>> {
        Err(Error::new(
            ErrorKind::Unsupported,
            "this harness runs no private broker to restart",
        ))
    }
}

/// Runs the publisher suite against [`MemoryBroker`], which declares every feature.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryPublisherHarness;

/// The prefix of the destinations a [`MemoryPublisherHarness`] namespace routes.
const ROUTED: &str = "routed.";

#[async_trait]
impl PublisherHarness for MemoryPublisherHarness {
    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>> {
        Ok(Box::new(MemoryNamespace::new()))
    }

    async fn restartable_namespace(&self) -> Result<Box<dyn RestartableNamespace>> {
        Ok(Box::new(MemoryNamespace::new()))
    }
}

/// A broker of its own per namespace, so stopping it touches no other case.
#[derive(Debug)]
struct MemoryNamespace(MemoryBroker);

impl MemoryNamespace {
    fn new() -> Self {
        let broker = MemoryBroker::new();
        broker.bind(ROUTED);
        MemoryNamespace(broker)
    }
}

#[async_trait]
impl RestartableNamespace for MemoryNamespace {
    async fn stop_broker(&self) -> Result<()> {
        self.0.stop();
        Ok(())
    }

    async fn start_broker(&self) -> Result<()> {
        self.0.start();
        Ok(())
    }
}

#[async_trait]
impl PublisherNamespace for MemoryNamespace {
    async fn publisher(&self) -> Result<Arc<dyn Publisher>> {
        Ok(Arc::new(self.0.clone()))
    }

    fn destination(&self, name: &str) -> String {
        format!("{ROUTED}{name}")
    }

    fn unroutable_destination(&self) -> String {
        "unbound.nowhere".to_owned()
    }

    async fn received(&self, destination: &str) -> Result<Vec<Received>> {
        Ok(self.0.received(destination))
    }
}
