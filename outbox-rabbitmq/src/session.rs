//! The connection, reconnected lazily, and its pool of confirm channels.
//!
//! ## Reconnecting
//!
//! 1. A publish call takes the current [`Session`] if its connection is still open
//!    (a lock held for a pointer copy, never across an await).
//! 2. Otherwise it takes the connect lock, waiting no longer than its deadline. Only one
//!    call connects at a time.
//! 3. Holding the lock, it looks again: a call that connected meanwhile left a usable
//!    session, and a call whose attempt **failed** meanwhile left its error, which every
//!    call that waited for that attempt returns without trying again. So a broker that
//!    is down costs one connect timeout per round of calls, not one per call.
//! 4. Otherwise it connects, bounded by the same deadline, and stores the session (or
//!    the failure).
//!
//! Each publish call borrows a channel of its own ([`Lease`]): publisher confirms and
//! returned messages are per channel, so batches never see each other's. A channel goes
//! back to the pool only after a call that ended cleanly; a call that failed, timed out
//! or was cancelled (its future dropped) drops its channel, which lapin closes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::{Error, ErrorKind, ErrorStatus, Result};
use tokio::time::{timeout_at, Instant};

use crate::config::RabbitPublisherConfig;
use crate::error;

/// Idle channels kept per connection; more concurrent calls open more, closed after.
const MAX_IDLE_CHANNELS: usize = 16;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a failed connect attempt left for the calls that waited on it.
struct Failure {
    kind: ErrorKind,
    status: ErrorStatus,
    message: String,
    cause: Option<String>,
}

impl Failure {
    fn of(err: &Error) -> Failure {
        Failure {
            kind: err.kind(),
            status: err.status(),
            message: err.message().to_owned(),
            cause: std::error::Error::source(err).map(ToString::to_string),
        }
    }

    fn to_error(&self) -> Error {
        let err = Error::new(self.kind, self.message.clone()).with_status(self.status);
        match &self.cause {
            Some(cause) => err.with_source(cause.clone()),
            None => err,
        }
    }
}

/// The connect lock's contents.
struct Attempts {
    count: u64,
    last_failure: Option<Failure>,
}

/// Connects, lazily and one call at a time.
pub(crate) struct Connector {
    config: RabbitPublisherConfig,
    current: Mutex<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<Attempts>,
    /// `Attempts::count`, readable without the lock.
    attempts: AtomicU64,
}

impl Connector {
    pub(crate) fn new(config: RabbitPublisherConfig) -> Self {
        Connector {
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Attempts {
                count: 0,
                last_failure: None,
            }),
            attempts: AtomicU64::new(0),
        }
    }

    pub(crate) fn config(&self) -> &RabbitPublisherConfig {
        &self.config
    }

    /// The current session, if its connection is open.
    pub(crate) fn usable(&self) -> Option<Arc<Session>> {
        lock(&self.current)
            .as_ref()
            .filter(|s| s.is_open())
            .cloned()
    }

    /// Drop `session` if it is still the current one, so the next publish reconnects.
    /// For a connection that looks open but did not answer in time: a silent network
    /// partition is noticed by lapin only when heartbeats stop.
    pub(crate) fn discard(&self, session: &Arc<Session>) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, session)) {
            tracing::warn!("RabbitMQ did not answer in time; reconnecting on the next publish");
            current.take();
        }
    }

    /// Close the connection, if there is one. The next publish reconnects.
    pub(crate) async fn close(&self) -> Result<()> {
        let session = lock(&self.current).take();
        match session {
            Some(session) if session.is_open() => session
                .connection
                .close(200, "closed by the application".into())
                .await
                .map_err(|e| error::from_lapin("closing the connection", e)),
            _ => Ok(()),
        }
    }

    /// A usable session by `deadline`: the current one, or a new connection.
    pub(crate) async fn session(&self, deadline: Instant) -> Result<Arc<Session>> {
        if let Some(session) = self.usable() {
            return Ok(session);
        }
        let seen = self.attempts.load(Ordering::Acquire);
        let waited = self.config.connect_timeout();
        let mut attempts = timeout_at(deadline, self.connecting.lock())
            .await
            .map_err(|_| error::timeout("waiting for another call's reconnect", waited))?;
        if let Some(session) = self.usable() {
            return Ok(session);
        }
        if attempts.count != seen {
            if let Some(failure) = &attempts.last_failure {
                return Err(failure.to_error());
            }
        }
        attempts.count += 1;
        // Cleared first: an attempt cancelled half-way leaves no verdict, and the calls
        // that waited on it try for themselves.
        attempts.last_failure = None;
        self.attempts.store(attempts.count, Ordering::Release);
        // Drop the dead session before connecting: its channels go with it.
        lock(&self.current).take();
        let result = match timeout_at(deadline, self.connect()).await {
            Ok(result) => result,
            Err(_) => Err(error::timeout("connecting to RabbitMQ", waited)),
        };
        match result {
            Ok(connection) => {
                tracing::info!(
                    connection_name = self.config.connection_name(),
                    "connected to RabbitMQ"
                );
                let session = Arc::new(Session::new(connection));
                *lock(&self.current) = Some(session.clone());
                Ok(session)
            }
            Err(err) => {
                tracing::warn!(error = %err.report(), "cannot connect to RabbitMQ");
                attempts.last_failure = Some(Failure::of(&err));
                Err(err)
            }
        }
    }

    async fn connect(&self) -> Result<Connection> {
        let uri = self.config.parsed_url()?;
        let properties = ConnectionProperties::default()
            .with_connection_name(self.config.connection_name().into());
        Connection::connect_uri(uri, properties)
            .await
            .map_err(|e| error::from_lapin("connecting to RabbitMQ", e))
    }
}

/// One connection, its idle confirm channels and the exchanges known to exist on it.
pub(crate) struct Session {
    connection: Connection,
    idle: Mutex<Vec<Channel>>,
    exchanges: Mutex<HashSet<String>>,
}

impl Session {
    fn new(connection: Connection) -> Self {
        Session {
            connection,
            idle: Mutex::new(Vec::new()),
            exchanges: Mutex::new(HashSet::new()),
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.connection.status().connected()
    }

    /// A confirm channel for one call: an idle one, or a new one by `deadline`.
    pub(crate) async fn channel(self: &Arc<Self>, deadline: Instant) -> Result<Lease> {
        let idle = {
            let mut idle = lock(&self.idle);
            let mut found = None;
            while let Some(channel) = idle.pop() {
                if channel.status().connected() {
                    found = Some(channel);
                    break;
                }
            }
            found
        };
        let channel = match idle {
            Some(channel) => channel,
            None => {
                let open = async {
                    let channel = self
                        .connection
                        .create_channel()
                        .await
                        .map_err(|e| error::from_lapin("opening a channel", e))?;
                    channel
                        .confirm_select(ConfirmSelectOptions::default())
                        .await
                        .map_err(|e| error::from_lapin("enabling publisher confirms", e))?;
                    Ok::<_, Error>(channel)
                };
                let waited = deadline.saturating_duration_since(Instant::now());
                timeout_at(deadline, open)
                    .await
                    .map_err(|_| error::timeout("opening a channel", waited))??
            }
        };
        Ok(Lease {
            channel: Some(channel),
            session: self.clone(),
        })
    }

    /// Whether `exchange` was seen to exist on this connection.
    pub(crate) fn knows_exchange(&self, exchange: &str) -> bool {
        exchange.is_empty() || lock(&self.exchanges).contains(exchange)
    }

    /// Forget the exchanges seen: one was deleted under a call.
    pub(crate) fn forget_exchanges(&self) {
        lock(&self.exchanges).clear();
    }

    /// Check which of `exchanges` exist (a passive `exchange.declare` each, on a
    /// throwaway channel, since a missing exchange closes the channel that asked).
    /// Returns `Ok(false)` for a missing one; remembers those that exist.
    pub(crate) async fn exchange_exists(&self, exchange: &str, deadline: Instant) -> Result<bool> {
        let check = async {
            let channel = self
                .connection
                .create_channel()
                .await
                .map_err(|e| error::from_lapin("opening a channel", e))?;
            let options = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let declared = channel
                .exchange_declare(
                    exchange.into(),
                    ExchangeKind::Direct,
                    options,
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(()) => {
                    // Best effort: dropping the channel closes it too.
                    let _ = channel.close(200, "checked".into()).await;
                    lock(&self.exchanges).insert(exchange.to_owned());
                    Ok(true)
                }
                Err(e) if error::is_not_found(&e) => Ok(false),
                Err(e) => Err(error::from_lapin("checking the exchange", e)),
            }
        };
        let waited = deadline.saturating_duration_since(Instant::now());
        timeout_at(deadline, check)
            .await
            .map_err(|_| error::timeout("checking the exchange", waited))?
    }
}

/// A channel borrowed by one publish call. [`release`](Self::release) returns it to
/// the pool; dropping the lease instead closes the channel.
pub(crate) struct Lease {
    channel: Option<Channel>,
    session: Arc<Session>,
}

impl Lease {
    pub(crate) fn channel(&self) -> &Channel {
        self.channel
            .as_ref()
            .expect("a lease holds its channel until released")
    }

    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Give the channel back for the next call, when it is still open.
    pub(crate) fn release(mut self) {
        if let Some(channel) = self.channel.take() {
            if channel.status().connected() {
                let mut idle = lock(&self.session.idle);
                if idle.len() < MAX_IDLE_CHANNELS {
                    idle.push(channel);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_connect_failure_keeps_kind_status_message_and_cause() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = Error::new(
            ErrorKind::Unavailable,
            "connecting to RabbitMQ: connection lost",
        )
        .with_source(io);
        let again = Failure::of(&err).to_error();
        assert_eq!(again.kind(), ErrorKind::Unavailable);
        assert!(again.is_retryable());
        assert_eq!(again.message(), err.message());
        assert_eq!(again.report().to_string(), err.report().to_string());

        let refused = Error::config("connecting to RabbitMQ: the broker replied 403");
        let again = Failure::of(&refused).to_error();
        assert_eq!(again.status(), ErrorStatus::Permanent);
        assert!(std::error::Error::source(&again).is_none());
    }
}
