//! The conformance suite: one `pub async fn` per behaviour, grouped by topic.
//!
//! Every case takes a [`Harness`], makes its own isolated store through it and fails
//! (panics) when the backend breaks the behaviour the case is named for. Run them all
//! with [`conformance_suite!`](crate::conformance_suite), which gives each case its own
//! `#[tokio::test]`.

mod admin;
mod backend;
mod claim;
mod consumer;
mod dedup;
mod fencing;
mod lock;
mod ordering;
mod plans;
mod publisher;
mod relay;
mod renewal;
mod retention;
mod retry;
mod settle_claim;

pub use admin::*;
pub use backend::*;
pub use claim::*;
pub use consumer::*;
pub use dedup::*;
pub use fencing::*;
pub use lock::*;
pub use ordering::*;
pub use plans::*;
pub use publisher::*;
pub use relay::*;
pub use renewal::*;
pub use retention::*;
pub use retry::*;
pub use settle_claim::*;

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::ClaimedMessage, store::Disposition,
    store::Failure, store::Lease, store::StoreCapabilities, DeadLetterFilter, DeadLetterPage,
    KeyOrder, Message, MessageId, NewMessage, OutboxAdmin, OutboxStats, OutboxStore, Publisher,
    Relay, RelayConfig, Retention, RetryPolicy,
};

use crate::harness::{Fixture, Harness};
pub(crate) use crate::macros::groups::require;

pub(crate) use crate::wait::{poll_for, wait_until, within, DEADLINE};
/// A lease long enough never to lapse during a case.
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(300);
/// A lease short enough to lapse while a case waits for it.
pub(crate) const SHORT_LEASE: Duration = Duration::from_millis(300);

pub(crate) async fn fixture(h: &dyn Harness, capabilities: StoreCapabilities) -> Box<dyn Fixture> {
    let fixture = h
        .fixture(capabilities)
        .await
        .expect("harness could not make a fixture");
    assert!(
        fixture.store().capabilities().same_semantics(&capabilities),
        "the store must report the ordering and retention it was made with: relays read \
         them ({:?} for {capabilities:?})",
        fixture.store().capabilities()
    );
    fixture
}

pub(crate) async fn plain(h: &dyn Harness) -> Box<dyn Fixture> {
    fixture(h, StoreCapabilities::default()).await
}

pub(crate) fn keeping() -> StoreCapabilities {
    StoreCapabilities::new(
        KeyOrder::Unordered,
        Retention::Keep {
            window: Duration::from_secs(3600),
        },
    )
}

pub(crate) fn msg(destination: &str, n: usize) -> NewMessage {
    NewMessage::builder(destination)
        .payload(format!("payload {n}").into_bytes())
        .build()
        .expect("valid message")
}

pub(crate) fn msgs(n: usize) -> Vec<NewMessage> {
    (0..n).map(|i| msg("conformance", i)).collect()
}

pub(crate) fn keyed(key: &str, n: usize) -> NewMessage {
    NewMessage::builder("ordered")
        .partition_key(key)
        .payload(format!("{key}/{n}").into_bytes())
        .build()
        .expect("valid message")
}

pub(crate) async fn claim(
    store: &dyn OutboxStore,
    limit: usize,
    lease: Duration,
) -> Vec<ClaimedMessage> {
    let request = ClaimRequest::new(limit, lease).expect("valid claim request");
    store
        .claim(request)
        .await
        .expect("claim failed")
        .into_messages()
}

pub(crate) async fn claim_ids(
    store: &dyn OutboxStore,
    ids: &[MessageId],
    lease: Duration,
) -> Vec<ClaimedMessage> {
    let request = ClaimIds::new(ids, lease).expect("valid claim of ids");
    store
        .claim_ids(&request)
        .await
        .expect("claim_ids failed")
        .into_messages()
}

pub(crate) async fn stats(admin: &dyn OutboxAdmin) -> OutboxStats {
    admin.stats().await.expect("stats failed")
}

/// Every dead letter (up to 1000), in id order.
pub(crate) async fn dead_letters(admin: &dyn OutboxAdmin) -> Vec<Message> {
    let page = DeadLetterPage::new(DeadLetterFilter::default(), 1000).expect("valid page");
    let dead = admin
        .dead_letters(&page)
        .await
        .expect("dead_letters failed");
    dead.into_iter().map(|d| d.message).collect()
}

/// A failed attempt for a case.
pub(crate) fn failure(lease: Lease, error: impl Into<String>, disposition: Disposition) -> Failure {
    Failure::new(lease, error, disposition)
}

/// Claim `n` messages one claim each: one batch per message, so each settles (and,
/// on a [`ClaimMode::HeldLock`](outbox_core::ClaimMode::HeldLock) store, commits) on
/// its own. Fails if fewer than `n` are due.
pub(crate) async fn claim_each(
    store: &dyn OutboxStore,
    n: usize,
    lease: Duration,
) -> Vec<ClaimedMessage> {
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        let mut one = claim(store, 1, lease).await;
        assert_eq!(one.len(), 1, "{} of {n} messages claimed", got.len());
        got.append(&mut one);
    }
    got
}

/// Whether `store` holds its claims by row locks
/// ([`ClaimMode::HeldLock`](outbox_core::ClaimMode::HeldLock)), where a lapsed lease
/// is lost whether or not the message was claimed again.
pub(crate) fn held_lock(store: &dyn OutboxStore) -> bool {
    store.capabilities().claim_mode == outbox_core::ClaimMode::HeldLock
}

/// Claim repeatedly until a claim returns something, failing after [`DEADLINE`].
pub(crate) async fn claim_eventually(
    store: &dyn OutboxStore,
    limit: usize,
    lease: Duration,
) -> Vec<ClaimedMessage> {
    poll_for("a claim to return messages", || async move {
        let got = claim(store, limit, lease).await;
        (!got.is_empty()).then_some(got)
    })
    .await
}

tokio::task_local! {
    /// The [`RelayConfig::pipeline_depth`] the relays of the running case use, when
    /// set by [`with_pipeline_depth`].
    static PIPELINE_DEPTH: usize;
}

/// Run `case` with every relay it makes at this
/// [`pipeline_depth`](RelayConfig::pipeline_depth) instead of the default; the
/// [`conformance_suite!`](crate::conformance_suite) runs the relay cases this way with
/// pipelining off (depth 1), besides their run at the default depth.
pub async fn with_pipeline_depth<F: std::future::Future>(depth: usize, case: F) -> F::Output {
    PIPELINE_DEPTH.scope(depth, case).await
}

/// Relay settings for fast tests: short polls, fast retries, and the pipeline depth of
/// [`with_pipeline_depth`] when the case runs inside it.
pub(crate) fn fast_relay_config() -> RelayConfig {
    let depth = PIPELINE_DEPTH
        .try_with(|depth| *depth)
        .unwrap_or(outbox_core::relay::DEFAULT_PIPELINE_DEPTH);
    RelayConfig::default()
        .with_pipeline_depth(depth)
        .with_lease(Duration::from_secs(30))
        .with_publish_timeout(Duration::from_secs(10))
        .with_poll_interval(Duration::from_millis(10))
        .with_max_poll_interval(Duration::from_millis(200))
        .with_retry(
            RetryPolicy::new(5)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(50)),
        )
        .with_shutdown_grace(Duration::from_secs(5))
}

pub(crate) fn relay(
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
) -> Relay {
    Relay::new(store, publisher, config).expect("valid relay config")
}
