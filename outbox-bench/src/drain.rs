//! Draining a loaded outbox: by the library's relays, or by a bench's own loop of the
//! library's statements on a pool of workers.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{ErrorKind, OutboxStore, Relay, RelayConfig};

use crate::publish::Counting;

/// Longest [`drain_library`] waits for its relays before it gives up.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// The relay configuration of [`drain_library`]: claim batch = publish batch =
/// `batch`, one publish call in flight, a 60 s lease, polls from 1 ms backing off to
/// 10 ms.
pub fn drain_config(batch: usize) -> RelayConfig {
    RelayConfig::default()
        .with_batch_size(batch)
        .with_lease(Duration::from_secs(60))
        .with_publish_batch_size(batch)
        .with_publish_concurrency(1)
        .with_poll_interval(Duration::from_millis(1))
        .with_max_poll_interval(Duration::from_millis(10))
}

/// `relays` relays (named `bench-0`, `bench-1`, ..., each on a clone of `store`, with
/// [`drain_config`]) publishing into one [`Counting`] publisher until it counted
/// `messages`, then shut down. A `Timeout` error after [`DRAIN_TIMEOUT`].
pub async fn drain_library<S>(
    store: &S,
    batch: usize,
    relays: usize,
    messages: u64,
) -> outbox_core::Result<()>
where
    S: OutboxStore + Clone + 'static,
{
    let publisher = Arc::new(Counting::new());
    let config = drain_config(batch);
    let handles: Vec<_> = (0..relays)
        .map(|i| {
            Relay::new(
                Arc::new(store.clone()),
                publisher.clone(),
                config.clone().with_name(format!("bench-{i}")),
            )
            .map(|relay| relay.spawn())
        })
        .collect::<outbox_core::Result<_>>()?;
    let drained = publisher.wait_for(messages, DRAIN_TIMEOUT).await;
    for handle in handles {
        handle.shutdown().await?;
    }
    drained
}

/// Run `worker(0)` .. `worker(workers - 1)` as tasks of their own until every one
/// returns: the worker pool of the raw drains (each worker a loop of the library's
/// own statements until nothing is due) and of concurrent writers. The first error
/// returned, a panicking worker as a `Panicked` error.
pub async fn run_workers<F, Fut>(workers: usize, worker: F) -> outbox_core::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = outbox_core::Result<()>> + Send + 'static,
{
    let tasks: Vec<_> = (0..workers).map(|i| tokio::spawn(worker(i))).collect();
    for task in tasks {
        task.await
            .map_err(|e| outbox_core::Error::new(ErrorKind::Panicked, e.to_string()))??;
    }
    Ok(())
}

/// Operations per second of `op(0)` .. `op(ops - 1)`, each called once, spread over
/// `concurrency` tasks that take the next index as they finish the last one.
///
/// # Panics
///
/// When an operation panics.
pub async fn ops_per_sec<F, Fut>(ops: usize, concurrency: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, op) = (Arc::clone(&next), Arc::clone(&op));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= ops {
                        break;
                    }
                    op(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        if let Err(e) = task.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    ops as f64 / started.elapsed().as_secs_f64()
}
