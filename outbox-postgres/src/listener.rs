//! Waking relays with `LISTEN`/`NOTIFY`: [`spawn_listener`].
//!
//! `NOTIFY` is off by default; read [`Notify`](crate::Notify) for what turning it on
//! costs your commits.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use outbox_core::backend::Backoff;
use outbox_core::{Error, Result, Wakeup};

use crate::ident;

/// First wait before reconnecting after the connection dropped.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Listen on `channel` and [`wake`](Wakeup::wake) `wakeup` on every notification.
///
/// Pair it with a [`PgOutbox`](crate::PgOutbox) whose enqueues notify that channel
/// (configured with [`Notify`](crate::Notify), off by default; the name is
/// [`PgOutboxConfig::notify_channel`](crate::PgOutboxConfig::notify_channel)) and the
/// relay's [`Relay::wakeup`](outbox_core::Relay::wakeup): relays in every process then
/// pick up committed messages at once instead of at their next poll. The price is paid
/// by the writers, not here (see [`Notify`](crate::Notify)).
///
/// # Behaviour
///
/// 1. A task holds one connection from `pool` and runs `LISTEN "channel"` on it.
/// 2. Every notification on the channel pokes `wakeup`.
/// 3. When the connection drops, the task reconnects with exponential backoff
///    ([`Backoff`], 100 ms doubling to 5 s, with jitter) and pokes `wakeup` after each
///    successful `LISTEN`, since notifications sent while it was away are lost. The
///    relay's polling covers the gap.
/// 4. It stops when [`ListenerHandle::stop`] is called, the signal given to
///    [`ListenerHandle::with_shutdown`] resolves, the handle is dropped, or the pool is
///    closed.
///
/// Must be called inside a Tokio runtime. The listener occupies one of the pool's
/// connections for as long as it runs.
///
/// ```no_run
/// # async fn demo(outbox: outbox_postgres::PgOutbox, relay: outbox_core::Relay) -> outbox_core::Result<()> {
/// // `outbox` was configured with `.with_notify(Notify::OnCommit)`.
/// let channel = outbox.config().notify_channel().expect("NOTIFY was turned on");
/// // The service's shutdown tree stops the relay and the listener together.
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// let listener = outbox_postgres::spawn_listener(outbox.pool().clone(), channel, relay.wakeup())?
///     .with_shutdown(shutdown.clone().cancelled_owned());
/// // ... run the relay; on shutdown:
/// shutdown.cancel();
/// listener.stop().await; // returns once the task has ended
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a channel name
/// that is not a valid identifier.
pub fn spawn_listener(
    pool: PgPool,
    channel: impl Into<String>,
    wakeup: Wakeup,
) -> Result<ListenerHandle> {
    let channel = channel.into();
    ident::validate("notify channel", &channel)
        .map_err(|e| Error::invalid_input(e.message().to_owned()))?;
    let counters = Arc::new(Counters::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(pool, channel, wakeup, counters.clone(), stop.clone()));
    Ok(ListenerHandle {
        counters,
        stop,
        task: Some(task),
    })
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    notifications: AtomicU64,
}

/// A running [`spawn_listener`] task. Dropping the handle stops the task.
#[derive(Debug)]
pub struct ListenerHandle {
    counters: Arc<Counters>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl ListenerHandle {
    /// Also stop listening when `signal` resolves, as [`stop`](Self::stop) would: pass
    /// a service's shutdown signal, or `token.cancelled_owned()` of a
    /// `tokio_util::sync::CancellationToken`, the same one given to
    /// [`Relay::with_shutdown`](outbox_core::Relay::with_shutdown).
    ///
    /// Spawns a task that waits for `signal`, so it must be called within a Tokio
    /// runtime.
    #[must_use]
    pub fn with_shutdown(self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = signal => stop.cancel(),
                () = stop.cancelled() => {}
            }
        });
        self
    }

    /// How many times the listener has started listening (1 after the first connect,
    /// +1 per reconnection): for a service's health check, where 0 means wake-ups are
    /// not arriving yet and a count that keeps rising means the connection keeps
    /// dropping (relays still find messages by polling meanwhile).
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(AtomicOrdering::SeqCst)
    }

    /// How many notifications it has received: for a health check or a dashboard, to
    /// confirm that producers' `NOTIFY` reaches this process.
    pub fn notifications(&self) -> u64 {
        self.counters.notifications.load(AtomicOrdering::SeqCst)
    }

    /// Whether the task has ended (stopped, or the pool was closed).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stop listening and wait for the task to end.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The task only ends by returning or, after a panic, with a JoinError;
            // either way it is gone.
            let _ = task.await;
        }
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn run(
    pool: PgPool,
    channel: String,
    wakeup: Wakeup,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
    loop {
        let connected = tokio::select! {
            connected = listen(&pool, &channel) => connected,
            () = stop.cancelled() => return,
        };
        let lost = match connected {
            Ok(mut listener) => {
                backoff.reset();
                counters.connections.fetch_add(1, AtomicOrdering::SeqCst);
                tracing::debug!(%channel, "listening for outbox notifications");
                // Anything notified while we were not listening is lost: look now.
                wakeup.wake();
                tokio::select! {
                    lost = receive(&mut listener, &wakeup, &counters) => lost,
                    () = stop.cancelled() => return,
                }
            }
            Err(e) => e,
        };
        if matches!(lost, sqlx::Error::PoolClosed) {
            tracing::debug!(%channel, "pool closed; notification listener stops");
            return;
        }
        let retry_in = backoff.next_delay();
        let err = crate::error::from_sqlx("listening for notifications", lost);
        tracing::warn!(
            %channel, error = %err.report(), ?retry_in,
            "notification listener disconnected"
        );
        tokio::select! {
            () = tokio::time::sleep(retry_in) => {}
            () = stop.cancelled() => return,
        }
    }
}

async fn listen(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Reconnection is ours to do (with backoff and a wake-up), not sqlx's.
    listener.eager_reconnect(false);
    listener.listen(channel).await?;
    Ok(listener)
}

/// Poke `wakeup` per notification until the connection fails; returns why.
async fn receive(listener: &mut PgListener, wakeup: &Wakeup, counters: &Counters) -> sqlx::Error {
    loop {
        match listener.try_recv().await {
            Ok(Some(_)) => {
                counters.notifications.fetch_add(1, AtomicOrdering::SeqCst);
                wakeup.wake();
            }
            Ok(None) => {
                return sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "listener connection lost",
                ))
            }
            Err(e) => return e,
        }
    }
}
