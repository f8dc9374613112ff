//! What a backend implements to run the conformance suite.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{
    store::StoreCapabilities, Error, ErrorKind, MessageId, NewMessage, OutboxAdmin, OutboxStore,
    Result,
};

use crate::harness::declared::Sealed;

/// What a backend under test supports beyond the [`OutboxStore`] contract, as its
/// suite macro declares it: every capability but those named in
/// [`conformance_suite!`](crate::conformance_suite)`(make; lacks(row_locks))`. The
/// cases that need a lacked capability show as ignored; the others read this through
/// [`Declared`](crate::Declared). A backend does not build it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Features {
    /// Stores can be made with [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey).
    pub per_key_ordering: bool,
    /// Stores can be made with [`Retention::Keep`](outbox_core::Retention::Keep).
    pub keep_retention: bool,
    /// [`Fixture::enqueue_rolled_back`] is implemented (a real transaction).
    pub transactional_enqueue: bool,
    /// [`Fixture::lock_row`] is implemented (a row lock held by another transaction).
    pub row_locks: bool,
    /// The stores declare
    /// [`StoreCapabilities::lease_renewal`](outbox_core::store::StoreCapabilities::lease_renewal)
    /// (checked against them by a case).
    pub lease_renewal: bool,
}

impl Features {
    /// Everything on: what a relational backend should support.
    pub fn all() -> Self {
        Features {
            per_key_ordering: true,
            keep_retention: true,
            transactional_enqueue: true,
            row_locks: true,
            lease_renewal: true,
        }
    }

    /// Everything but the capabilities `lacks` names (a suite macro's list).
    pub(crate) fn lacking(lacks: &[&str]) -> Self {
        let has = |name: &str| !lacks.contains(&name);
        Features {
            per_key_ordering: has("per_key_ordering"),
            keep_retention: has("keep_retention"),
            transactional_enqueue: has("transactional_enqueue"),
            row_locks: has("row_locks"),
            lease_renewal: has("lease_renewal"),
        }
    }
}

/// Hands out isolated stores, one per conformance case.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// What the backend supports, as its suite macro declared it; answered by
    /// [`Declared`](crate::Declared), never by a backend (no other crate can name the
    /// argument). A harness used without its macro supports everything.
    fn features(&self, _: Sealed) -> Features {
        Features::all()
    }

    /// A fresh store with these capabilities and its own schema, table or key prefix,
    /// so cases can run in parallel and never see each other's rows. The suite asks
    /// for per-key order and kept history only when [`Features`] says the
    /// backend supports them ([`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey),
    /// [`Retention::Keep`](outbox_core::Retention::Keep)).
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>>;
}

/// One case's store plus the backend-specific hooks the suite needs.
#[async_trait]
pub trait Fixture: Send + Sync + fmt::Debug {
    /// The store under test, as a relay sees it.
    fn store(&self) -> Arc<dyn OutboxStore>;

    /// The same store, as an operator sees it.
    fn admin(&self) -> Arc<dyn OutboxAdmin>;

    /// Enqueue `messages` through the backend's own enqueue path in one transaction and
    /// commit it. All or nothing: an invalid message fails the whole call.
    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()>;

    /// Enqueue `messages` in a transaction and roll it back.
    async fn enqueue_rolled_back(&self, _messages: Vec<NewMessage>) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, "enqueue_rolled_back"))
    }

    /// Stamp the message `id` as dispatched now, as another tool writing to the table
    /// might, changing nothing else (a dead letter stays dead).
    async fn mark_dispatched(&self, id: MessageId) -> Result<()>;

    /// Lock the row of `id` from another transaction (as a concurrent writer would)
    /// until the returned guard is released.
    async fn lock_row(&self, _id: MessageId) -> Result<Box<dyn RowLock>> {
        Err(Error::new(ErrorKind::Unsupported, "lock_row"))
    }
}

/// A row lock held by another transaction, from [`Fixture::lock_row`].
#[async_trait]
pub trait RowLock: Send + fmt::Debug {
    /// End the holding transaction.
    async fn release(self: Box<Self>) -> Result<()>;
}
