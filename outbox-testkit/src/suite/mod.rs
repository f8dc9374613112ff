//! The conformance suite: one `pub async fn` per behaviour, grouped by topic.
//!
//! Every case takes a [`Harness`], makes its own isolated store through it and fails
//! (panics) when the backend breaks the behaviour the case is named for. Run them all
//! with [`conformance_suite!`](crate::conformance_suite), which gives each case its own
//! `#[tokio::test]`.

mod backend;
mod claim;
mod fencing;
mod ordering;
mod relay;
mod retention;
mod retry;

pub use backend::*;
pub use claim::*;
pub use fencing::*;
pub use ordering::*;
pub use relay::*;
pub use retention::*;
pub use retry::*;

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    ClaimRequest, ClaimedMessage, KeyOrder, NewMessage, OutboxStats, OutboxStore, Publisher, Relay,
    RelayConfig, Retention, RetryPolicy,
};

use crate::harness::{Features, Fixture, FixtureOptions, Harness};

pub(crate) use crate::wait::{poll_for, wait_until, DEADLINE};
/// A lease long enough never to lapse during a case.
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(300);
/// A lease short enough to lapse while a case waits for it.
pub(crate) const SHORT_LEASE: Duration = Duration::from_millis(300);

pub(crate) async fn fixture(h: &dyn Harness, options: FixtureOptions) -> Box<dyn Fixture> {
    h.fixture(options)
        .await
        .expect("harness could not make a fixture")
}

pub(crate) async fn plain(h: &dyn Harness) -> Box<dyn Fixture> {
    fixture(h, FixtureOptions::default()).await
}

pub(crate) fn keeping() -> FixtureOptions {
    FixtureOptions {
        ordering: KeyOrder::Unordered,
        retention: Retention::Keep {
            window: Duration::from_secs(3600),
        },
    }
}

/// Returns `false` and prints a skip line when the backend lacks a feature.
pub(crate) fn supports(h: &dyn Harness, case: &str, need: impl Fn(Features) -> bool) -> bool {
    let ok = need(h.features());
    if !ok {
        eprintln!("SKIPPED conformance case {case}: the backend does not declare the feature");
    }
    ok
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
    store
        .claim(ClaimRequest::new(limit, lease))
        .await
        .expect("claim failed")
}

pub(crate) async fn stats(store: &dyn OutboxStore) -> OutboxStats {
    store.stats().await.expect("stats failed")
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

/// Relay settings for fast tests: short polls, fast retries.
pub(crate) fn fast_relay_config() -> RelayConfig {
    RelayConfig::default()
        .lease(Duration::from_secs(30))
        .poll(Duration::from_millis(10), Duration::from_millis(200))
        .retry(
            RetryPolicy::with_max_attempts(5)
                .backoff(Duration::from_millis(10), Duration::from_millis(50)),
        )
        .shutdown_grace(Duration::from_secs(5))
}

pub(crate) fn relay(
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
) -> Relay {
    Relay::new(store, publisher, config).expect("valid relay config")
}
