//! Waiting on a condition with a deadline, instead of sleeping and hoping.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`wait_until`] and [`poll_for`] wait before failing the test.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Poll `attempt` until it returns `Some`, and return that value. Polls back off from
/// 5 ms to 100 ms (with jitter, [`outbox_core::backend::Backoff`]).
///
/// # Panics
/// After [`DEADLINE`], naming `what` was awaited.
pub async fn poll_for<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    let mut pause =
        outbox_core::backend::Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
    loop {
        if let Some(found) = attempt().await {
            return found;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        pause.wait().await;
    }
}

/// Poll `check` until it returns `true`.
///
/// # Panics
/// After [`DEADLINE`], naming `what` was awaited.
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_for(what, || {
        let done = check();
        async move { done.await.then_some(()) }
    })
    .await;
}

/// Await `future`, failing the test instead of hanging when it has not finished
/// within [`DEADLINE`]: a hang is not a verdict.
///
/// # Panics
/// After [`DEADLINE`], naming `what` was awaited.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {DEADLINE:?}"),
    }
}
