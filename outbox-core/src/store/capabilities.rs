//! What a store declares it does: [`StoreCapabilities`], with [`KeyOrder`],
//! [`Retention`] and [`ClaimMode`].

#[cfg(doc)]
use super::OutboxStore;
use std::time::Duration;

/// Whether claims keep per-key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyOrder {
    /// Any due message may be claimed; messages sharing a key may publish out of order.
    #[default]
    Unordered,
    /// A message is claimable only when no earlier message with the same partition key
    /// is pending or in flight. Dead-lettered messages do not block their key.
    PerKey,
}

/// What happens to a message once completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Delete the row in the completing statement.
    #[default]
    Delete,
    /// Keep dispatched rows (for audit or replay) until [`OutboxAdmin::purge_dispatched`](crate::OutboxAdmin::purge_dispatched)
    /// removes those older than the window.
    Keep {
        /// How long dispatched rows are kept.
        window: Duration,
    },
}

/// How a store holds the messages it claimed while a relay publishes them.
///
/// Chosen per store (for example `PgOutboxConfig::with_claim_mode`), declared in
/// [`StoreCapabilities::claim_mode`]; the relay works the same in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimMode {
    /// The claim writes a lease into each message (expiry, token, attempt) and commits
    /// at once; the relay publishes with no transaction open. A crashed relay's
    /// messages come due when the lease expires. Works on every store.
    #[default]
    Lease,
    /// The claim locks the messages in a transaction on a connection the store keeps
    /// for the batch, writing nothing to them; the settle runs in that transaction and
    /// commits it. The row lock is the lease: a crashed relay's messages are claimable
    /// as soon as the server ends its session, and a session idle in the transaction
    /// for longer than the lease is ended by the server. What differs from
    /// [`Lease`](Self::Lease) is listed on [`OutboxStore`] ("Held-lock claims").
    HeldLock,
}

/// What a store does, so relays and the conformance suite know what to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StoreCapabilities {
    /// The ordering this store's claims enforce.
    pub ordering: KeyOrder,
    /// What completing does.
    pub retention: Retention,
    /// Whether [`OutboxStore::renew`] extends leases. `false` (the default) for a store
    /// that keeps the default method, which refuses: relays then never renew and a
    /// claimed batch must be published within one lease, as
    /// [`RelayConfig::validate`](crate::RelayConfig::validate) checks.
    pub lease_renewal: bool,
    /// How claims hold messages ([`ClaimMode::Lease`] unless declared).
    pub claim_mode: ClaimMode,
    /// The most claimed batches the store can hold at once, over all its relays, when
    /// it is bounded (held-lock claims keep a connection per batch); `None` when not.
    /// [`Relay::new`](crate::Relay::new) refuses a relay that alone could need more.
    pub batches_in_flight: Option<usize>,
}

impl StoreCapabilities {
    /// Capabilities with this ordering and retention, without lease renewal.
    pub fn new(ordering: KeyOrder, retention: Retention) -> Self {
        StoreCapabilities {
            ordering,
            retention,
            lease_renewal: false,
            claim_mode: ClaimMode::Lease,
            batches_in_flight: None,
        }
    }

    /// The same, declaring how claims hold messages.
    #[must_use]
    pub fn with_claim_mode(mut self, mode: ClaimMode) -> Self {
        self.claim_mode = mode;
        self
    }

    /// The same, declaring the most claimed batches the store can hold at once.
    #[must_use]
    pub fn with_batches_in_flight(mut self, bound: Option<usize>) -> Self {
        self.batches_in_flight = bound;
        self
    }

    /// The same, declaring whether [`OutboxStore::renew`] is implemented.
    #[must_use]
    pub fn with_lease_renewal(mut self, renews: bool) -> Self {
        self.lease_renewal = renews;
        self
    }

    /// Whether `other` asks for the same ordering and retention: what a store made for
    /// `other` must match (the optional capabilities, such as
    /// [`lease_renewal`](Self::lease_renewal), are the store's to declare).
    pub fn same_semantics(&self, other: &StoreCapabilities) -> bool {
        self.ordering == other.ordering && self.retention == other.retention
    }
}
