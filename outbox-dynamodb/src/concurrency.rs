//! Bounded concurrency for the per-item requests of one call (reads of candidates,
//! settles, renewals, shard leases): at most [`CONCURRENCY`] in flight, results in
//! input order. [`bounded`] stops at the first error; [`bounded_all`] runs every
//! future to its end.

use futures::stream::{self, StreamExt, TryStreamExt};
use outbox_core::Result;

/// Requests in flight at once for the per-item writes of one batch.
pub(crate) const CONCURRENCY: usize = 16;

/// Run `futures` at most [`CONCURRENCY`] at a time, results in input order, stopping
/// at the first error. The futures are made up front: a lazily mapped stream trips the
/// compiler's higher-ranked lifetime inference inside `async_trait` methods.
///
/// Only for reads and for writes whose partial application needs no accounting: the
/// futures still in flight at an error are dropped, after their requests may have
/// landed. Per-message writes go through [`bounded_all`].
pub(crate) async fn bounded<T, F>(futures: Vec<F>) -> Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    stream::iter(futures)
        .buffered(CONCURRENCY)
        .try_collect()
        .await
}

/// Run every one of `futures` to its end, at most [`CONCURRENCY`] at a time, results in
/// input order: one failed write neither stops the others nor drops them in flight.
pub(crate) async fn bounded_all<T, F>(futures: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    stream::iter(futures).buffered(CONCURRENCY).collect().await
}
