//! Waking relays with `LISTEN`/`NOTIFY`: [`spawn_listener`].
//!
//! `NOTIFY` is off by default and worth turning on only when its cost is acceptable:
//! it gives the lowest commit-to-publish latency across processes, but PostgreSQL
//! serialises the commits of every transaction that issued `NOTIFY` on one cluster-wide
//! lock, so all enqueueing transactions commit one at a time. Without it, wake a relay
//! in the same process after your commit with
//! [`Relay::wakeup`](outbox_core::Relay::wakeup), and let polling find messages
//! committed elsewhere. See
//! [`PgOutboxConfig::notify_on_commit`](crate::PgOutboxConfig::notify_on_commit).

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use outbox_core::{Error, Result, Wakeup};

use crate::config::validate_identifier;

/// First wait before reconnecting after the connection dropped.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Listen on `channel` and [`wake`](Wakeup::wake) `wakeup` on every notification.
///
/// Pair it with a [`PgOutbox`](crate::PgOutbox) whose enqueues notify that channel
/// (configured with
/// [`PgOutboxConfig::notify_on_commit`](crate::PgOutboxConfig::notify_on_commit), which
/// is off by default; the name is
/// [`PgOutboxConfig::notify_channel`](crate::PgOutboxConfig::notify_channel)) and the
/// relay's [`Relay::wakeup`](outbox_core::Relay::wakeup): relays in every process then
/// pick up committed messages at once instead of at their next poll.
///
/// The price is paid by the writers, not here: each enqueueing transaction then takes
/// PostgreSQL's cluster-wide notify lock at commit and holds it until its commit has
/// completed, so enqueueing commits are serialised across the whole server. Prefer an
/// in-process [`Relay::wakeup`](outbox_core::Relay::wakeup) after commit plus polling
/// unless cross-process latency matters more than commit throughput.
///
/// # Behaviour
///
/// 1. A task holds one connection from `pool` and runs `LISTEN "channel"` on it.
/// 2. Every notification on the channel pokes `wakeup`.
/// 3. When the connection drops, the task reconnects with exponential backoff (100 ms
///    doubling to 5 s) and pokes `wakeup` after each successful `LISTEN`, since
///    notifications sent while it was away are lost. The relay's polling covers the gap.
/// 4. It stops when [`ListenerHandle::stop`] is called, the handle is dropped, or the
///    pool is closed.
///
/// Must be called inside a Tokio runtime. The listener occupies one of the pool's
/// connections for as long as it runs.
///
/// ```no_run
/// # async fn demo(outbox: outbox_postgres::PgOutbox, relay: outbox_core::Relay) -> outbox_core::Result<()> {
/// // `outbox` was configured with `PgOutboxConfig::default().notify_on_commit()`.
/// let channel = outbox.config().notify_channel().expect("NOTIFY was turned on");
/// let listener = outbox_postgres::spawn_listener(outbox.pool().clone(), channel, relay.wakeup())?;
/// // ... run the relay ...
/// listener.stop().await;
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
    validate_identifier("notify channel", &channel)
        .map_err(|e| Error::invalid_input(e.message().to_owned()))?;
    let counters = Arc::new(Counters::default());
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(run(pool, channel, wakeup, counters.clone(), stopped));
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
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl ListenerHandle {
    /// How many times the listener has started listening (1 after the first connect,
    /// +1 per reconnection).
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(AtomicOrdering::SeqCst)
    }

    /// How many notifications it has received.
    pub fn notifications(&self) -> u64 {
        self.counters.notifications.load(AtomicOrdering::SeqCst)
    }

    /// Whether the task has ended (stopped, or the pool was closed).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stop listening and wait for the task to end.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            // The task only ends by returning or, after a panic, with a JoinError;
            // either way it is gone.
            let _ = task.await;
        }
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
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
    mut stopped: watch::Receiver<bool>,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let connected = tokio::select! {
            connected = listen(&pool, &channel) => connected,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        let lost = match connected {
            Ok(mut listener) => {
                backoff = MIN_BACKOFF;
                counters.connections.fetch_add(1, AtomicOrdering::SeqCst);
                tracing::debug!(%channel, "listening for outbox notifications");
                // Anything notified while we were not listening is lost: look now.
                wakeup.wake();
                tokio::select! {
                    lost = receive(&mut listener, &wakeup, &counters) => lost,
                    _ = stopped.wait_for(|stop| *stop) => return,
                }
            }
            Err(e) => e,
        };
        if matches!(lost, sqlx::Error::PoolClosed) {
            tracing::debug!(%channel, "pool closed; notification listener stops");
            return;
        }
        tracing::warn!(
            %channel, error = %lost, retry_in = ?backoff,
            "notification listener disconnected"
        );
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
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
