//! Settings: [`WalOutboxConfig`] (where messages go and what the log carries),
//! [`WalRelayConfig`] (how the relay streams and publishes) and [`ReplicationTarget`]
//! (where the relay's replication connection goes).

use std::fmt;
use std::time::Duration;

use outbox_core::backend::validate_identifier;
use outbox_core::{Error, MessageLimits, Result, RetryPolicy};
use outbox_postgres::PgOutboxConfig;

/// PostgreSQL's longest identifier, also the limit for slot and publication names.
const MAX_NAME_LEN: usize = 63;

/// Where a [`WalOutbox`](crate::WalOutbox) writes and what its relay reads.
///
/// ```
/// use outbox_postgres_wal::WalOutboxConfig;
///
/// let config = WalOutboxConfig::default().with_slot("billing_outbox");
/// config.validate()?;
/// assert_eq!(config.prefix(), "outbox");
/// assert_eq!(config.publication(), "outbox_wal");
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalOutboxConfig {
    slot: String,
    publication: String,
    prefix: String,
    limits: MessageLimits,
    dead_letters: PgOutboxConfig,
}

impl Default for WalOutboxConfig {
    /// Slot `outbox_wal`, publication `outbox_wal`, prefix `outbox`, default limits,
    /// dead letters in `outbox-postgres`'s default table (`outbox.outbox_messages`).
    fn default() -> Self {
        WalOutboxConfig {
            slot: "outbox_wal".to_owned(),
            publication: "outbox_wal".to_owned(),
            prefix: "outbox".to_owned(),
            limits: MessageLimits::default(),
            dead_letters: PgOutboxConfig::default(),
        }
    }
}

impl WalOutboxConfig {
    /// The logical replication slot the relay reads (an identifier: `[a-z_][a-z0-9_]*`,
    /// at most 63 bytes). One slot per relay; see the crate docs on scaling out.
    #[must_use]
    pub fn with_slot(mut self, slot: impl Into<String>) -> Self {
        self.slot = slot.into();
        self
    }

    /// The publication named to `pgoutput` (an identifier). The relay reads only
    /// logical decoding messages, so the publication needs no tables;
    /// [`WalOutbox::install`](crate::WalOutbox::install) creates it empty.
    #[must_use]
    pub fn with_publication(mut self, publication: impl Into<String>) -> Self {
        self.publication = publication.into();
        self
    }

    /// The logical decoding message prefix that marks this outbox's messages (an
    /// identifier). Relays over the same slot publish only messages with their prefix
    /// and skip every other message, so several outboxes can share a database.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The limits enqueue checks every message against (those of `outbox-core`).
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The `outbox-postgres` table holding this outbox's dead letters, listed and
    /// requeued with `PgOutbox`'s admin (`OutboxAdmin`).
    #[must_use]
    pub fn with_dead_letters(mut self, table: PgOutboxConfig) -> Self {
        self.dead_letters = table;
        self
    }

    /// The slot's name.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// The publication's name.
    pub fn publication(&self) -> &str {
        &self.publication
    }

    /// The message prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The message limits.
    pub fn limits(&self) -> &MessageLimits {
        &self.limits
    }

    /// The dead-letter table's config.
    pub fn dead_letters(&self) -> &PgOutboxConfig {
        &self.dead_letters
    }

    /// Check every name.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a name that is not an
    /// identifier, or an invalid dead-letter table config.
    pub fn validate(&self) -> Result<()> {
        let check = |what: &str, name: &str| {
            validate_identifier(what, name, MAX_NAME_LEN)
                .map_err(|e| Error::config(e.message().to_owned()))
        };
        check("replication slot", &self.slot)?;
        check("publication", &self.publication)?;
        check("message prefix", &self.prefix)?;
        self.dead_letters.validate()
    }
}

/// The most publish calls a log-tailing relay may have in flight
/// ([`WalRelayConfig::publish_concurrency`]).
pub const MAX_PUBLISH_CONCURRENCY: usize = 64;

/// How a [`WalRelay`](crate::WalRelay) publishes and keeps its place.
///
/// ```
/// use std::time::Duration;
/// use outbox_postgres_wal::WalRelayConfig;
///
/// let config = WalRelayConfig::default()
///     .with_batch_size(200)
///     .with_status_interval(Duration::from_millis(100));
/// config.validate()?;
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WalRelayConfig {
    /// Most messages handed to one `Publisher::publish` call. Default 256.
    pub batch_size: usize,
    /// Publish calls in flight at once: the relay hands the next batch to the
    /// publisher while earlier ones await the broker's acknowledgements, as the polling
    /// relay's `publish_concurrency`. Together with `batch_size` it bounds what a killed
    /// relay publishes again (`batch_size × publish_concurrency` in flight). 1 to
    /// [`MAX_PUBLISH_CONCURRENCY`]; default 4.
    pub publish_concurrency: usize,
    /// How often the confirmed position is reported to the server (standby status
    /// updates). A relay killed between two reports republishes what it published since
    /// the last one. Default 200 ms.
    pub status_interval: Duration,
    /// Attempts and backoff for retryable publish failures; after `max_attempts` the
    /// message is dead-lettered. Default: `RetryPolicy::default()`.
    pub retry: RetryPolicy,
    /// First wait before reconnecting after the stream or the database failed; the
    /// waits grow from it up to [`max_reconnect_backoff`](Self::max_reconnect_backoff).
    /// Default 100 ms.
    pub initial_reconnect_backoff: Duration,
    /// Longest wait before reconnecting. Default 30 s.
    pub max_reconnect_backoff: Duration,
    /// How often a relay waiting for another relay's slot lock tries again. Default 1 s.
    pub lock_retry: Duration,
    /// How often the slot's lag is read, exported as gauges and checked for
    /// invalidation. Default 5 s.
    pub lag_interval: Duration,
    /// The replication connection's `application_name`. Default `outbox-wal-relay`.
    pub application_name: String,
    /// How long a publish in flight may run on after shutdown was requested before
    /// the relay abandons it (unconfirmed: the next relay publishes its messages
    /// again). Default 10 s, as the polling relay's.
    pub shutdown_grace: Duration,
    /// The longest one `Publisher::publish` call may take: a call still unanswered then
    /// is dropped and its messages fail retryably (counted as attempts, then resumed
    /// from the confirmed position, as any retryable failure). Default 10 s, as the
    /// polling relay's.
    pub publish_timeout: Duration,
}

impl Default for WalRelayConfig {
    fn default() -> Self {
        WalRelayConfig {
            batch_size: 256,
            publish_concurrency: 4,
            status_interval: Duration::from_millis(200),
            retry: RetryPolicy::default(),
            initial_reconnect_backoff: Duration::from_millis(100),
            max_reconnect_backoff: Duration::from_secs(30),
            lock_retry: Duration::from_secs(1),
            lag_interval: Duration::from_secs(5),
            application_name: "outbox-wal-relay".to_owned(),
            shutdown_grace: Duration::from_secs(10),
            publish_timeout: Duration::from_secs(10),
        }
    }
}

impl WalRelayConfig {
    /// Set [`batch_size`](Self::batch_size).
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Set [`publish_concurrency`](Self::publish_concurrency).
    #[must_use]
    pub fn with_publish_concurrency(mut self, calls: usize) -> Self {
        self.publish_concurrency = calls;
        self
    }

    /// Set [`status_interval`](Self::status_interval).
    #[must_use]
    pub fn with_status_interval(mut self, interval: Duration) -> Self {
        self.status_interval = interval;
        self
    }

    /// Set [`retry`](Self::retry).
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Set [`initial_reconnect_backoff`](Self::initial_reconnect_backoff).
    #[must_use]
    pub fn with_initial_reconnect_backoff(mut self, wait: Duration) -> Self {
        self.initial_reconnect_backoff = wait;
        self
    }

    /// Set [`max_reconnect_backoff`](Self::max_reconnect_backoff).
    #[must_use]
    pub fn with_max_reconnect_backoff(mut self, wait: Duration) -> Self {
        self.max_reconnect_backoff = wait;
        self
    }

    /// Set [`lock_retry`](Self::lock_retry).
    #[must_use]
    pub fn with_lock_retry(mut self, interval: Duration) -> Self {
        self.lock_retry = interval;
        self
    }

    /// Set [`lag_interval`](Self::lag_interval).
    #[must_use]
    pub fn with_lag_interval(mut self, interval: Duration) -> Self {
        self.lag_interval = interval;
        self
    }

    /// Set [`shutdown_grace`](Self::shutdown_grace).
    #[must_use]
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Set [`publish_timeout`](Self::publish_timeout).
    #[must_use]
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Check the values.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a zero batch size,
    /// a batch above [`outbox_core::store::MAX_CLAIM_BATCH`], a publish concurrency
    /// outside `1..=`[`MAX_PUBLISH_CONCURRENCY`], a zero interval or
    /// publish timeout, a backoff whose first wait exceeds its longest, an invalid retry
    /// policy or an empty application name.
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > outbox_core::store::MAX_CLAIM_BATCH {
            return Err(Error::config(format!(
                "batch size must be within 1..={}",
                outbox_core::store::MAX_CLAIM_BATCH
            )));
        }
        if !(1..=MAX_PUBLISH_CONCURRENCY).contains(&self.publish_concurrency) {
            return Err(Error::config(format!(
                "publish concurrency must be within 1..={MAX_PUBLISH_CONCURRENCY}"
            )));
        }
        for (what, d) in [
            ("status interval", self.status_interval),
            ("lock retry interval", self.lock_retry),
            ("lag interval", self.lag_interval),
            ("first reconnect wait", self.initial_reconnect_backoff),
            ("publish timeout", self.publish_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::config(format!("{what} must be above zero")));
            }
        }
        if self.initial_reconnect_backoff > self.max_reconnect_backoff {
            return Err(Error::config("first reconnect wait exceeds the longest"));
        }
        if self.application_name.trim().is_empty() {
            return Err(Error::config("application name must not be empty"));
        }
        self.retry.validate()
    }
}

/// Where the relay opens its replication connection: host, port, user, password,
/// database and TLS, read from a `postgres://` URL. The user needs the `REPLICATION`
/// attribute (or to be a superuser).
///
/// TLS follows libpq's `sslmode` (with the crate's default feature `tls`, rustls):
/// `disable`; `allow` and `prefer` (the default): TLS when the server offers it, no
/// certificate check; `require`: TLS, no certificate check; `verify-ca`: TLS, the
/// chain checked against `sslrootcert` (a PEM file; the Mozilla roots when absent);
/// `verify-full`: also the host name, which must then be a DNS name (the client does
/// not match IP addresses; use `verify-ca` to reach a server by address). Use
/// `verify-full` in production. Client
/// certificates (`sslcert`, `sslkey`) are not supported and refused. Without the `tls`
/// feature only `disable`, `allow` and `prefer` are accepted, and connect in plain
/// text.
///
/// `Debug` hides the password.
///
/// ```
/// use outbox_postgres_wal::ReplicationTarget;
///
/// let t = ReplicationTarget::from_url("postgres://relay:s3cret@db.internal:6432/shop")?;
/// assert_eq!((t.host(), t.port(), t.user(), t.database()), ("db.internal", 6432, "relay", "shop"));
/// assert!(!format!("{t:?}").contains("s3cret"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ReplicationTarget {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    sslmode: SslMode,
    root_cert: Option<std::path::PathBuf>,
}

/// libpq's `sslmode` values the relay knows (`allow` is read as `prefer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self> {
        let mode = match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::config(format!(
                    "replication URL: unknown sslmode {other:?}"
                )))
            }
        };
        if cfg!(not(feature = "tls")) && !matches!(mode, SslMode::Disable | SslMode::Prefer) {
            return Err(Error::config(format!(
                "sslmode={value} needs TLS: build outbox-postgres-wal with its `tls` feature"
            )));
        }
        Ok(mode)
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl ReplicationTarget {
    /// Read a `postgres://user[:password]@host[:port][/database]` URL. The database
    /// defaults to the user's name, the port to 5432.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a URL that does not
    /// parse, another scheme, a missing host or user, an unknown `sslmode` (or one
    /// that needs TLS without the `tls` feature), or a client certificate.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::config(format!("replication URL does not parse: {e}")))?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(Error::config(
                "replication URL must start with postgres:// or postgresql://",
            ));
        }
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Error::config("replication URL has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let user = percent_decode("user", parsed.username())?;
        if user.is_empty() {
            return Err(Error::config("replication URL has no user"));
        }
        let password = match parsed.password() {
            Some(p) => percent_decode("password", p)?,
            None => String::new(),
        };
        let database = match parsed.path().trim_start_matches('/') {
            "" => user.clone(),
            db => percent_decode("database", db)?,
        };
        let (mut sslmode, mut root_cert) = (SslMode::Prefer, None);
        for (key, value) in parsed.query_pairs() {
            match &*key {
                "sslmode" => sslmode = SslMode::parse(&value)?,
                "sslrootcert" => root_cert = Some(std::path::PathBuf::from(&*value)),
                "sslcert" | "sslkey" | "sslpassword" => {
                    return Err(Error::config(format!(
                        "replication URL: {key}: client certificates are not supported"
                    )))
                }
                _ => {}
            }
        }
        Ok(ReplicationTarget {
            host,
            port: parsed.port().unwrap_or(5432),
            user,
            password,
            database,
            sslmode,
            root_cert,
        })
    }

    /// The server's host name or address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The database holding the slot.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The `sslmode` in effect (`prefer` when the URL gives none; `allow` reads as
    /// `prefer`).
    pub fn sslmode(&self) -> &'static str {
        self.sslmode.name()
    }

    pub(crate) fn password(&self) -> &str {
        &self.password
    }

    /// The replication client's TLS settings.
    #[cfg(feature = "tls")]
    pub(crate) fn tls(&self) -> pgwire_replication::TlsConfig {
        use pgwire_replication::TlsConfig;
        let root = self.root_cert.clone();
        match self.sslmode {
            SslMode::Disable => TlsConfig::disabled(),
            SslMode::Prefer => TlsConfig {
                mode: pgwire_replication::SslMode::Prefer,
                ..TlsConfig::disabled()
            },
            SslMode::Require => TlsConfig::require(),
            SslMode::VerifyCa => TlsConfig::verify_ca(root),
            SslMode::VerifyFull => TlsConfig::verify_full(root),
        }
    }

    /// The replication client's TLS settings: none without the `tls` feature (only
    /// `disable` and `prefer` parse then).
    #[cfg(not(feature = "tls"))]
    pub(crate) fn tls(&self) -> pgwire_replication::TlsConfig {
        pgwire_replication::TlsConfig::disabled()
    }
}

/// `text` with its `%XX` escapes decoded (URL userinfo and path: `+` and `&` stand
/// for themselves, unlike in a query string).
fn percent_decode(what: &str, text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::config(format!("replication URL: bad percent escape in the {what}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::config(format!("replication URL: the {what} is not UTF-8")))
}

impl fmt::Debug for ReplicationTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("sslmode", &self.sslmode.name())
            .field("sslrootcert", &self.root_cert)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn names_must_be_identifiers() {
        assert!(WalOutboxConfig::default().validate().is_ok());
        for bad in [
            WalOutboxConfig::default().with_slot("Bad-Slot"),
            WalOutboxConfig::default().with_publication("p; drop"),
            WalOutboxConfig::default().with_prefix(""),
            WalOutboxConfig::default().with_slot("s".repeat(64)),
        ] {
            assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::Config);
        }
    }

    #[test]
    fn relay_config_bounds() {
        assert!(WalRelayConfig::default().validate().is_ok());
        for bad in [
            WalRelayConfig::default().with_batch_size(0),
            WalRelayConfig::default().with_batch_size(outbox_core::store::MAX_CLAIM_BATCH + 1),
            WalRelayConfig::default().with_status_interval(Duration::ZERO),
            WalRelayConfig::default()
                .with_initial_reconnect_backoff(Duration::from_secs(2))
                .with_max_reconnect_backoff(Duration::from_secs(1)),
            WalRelayConfig::default().with_retry(RetryPolicy::new(0)),
            WalRelayConfig::default().with_lock_retry(Duration::ZERO),
            WalRelayConfig::default().with_lag_interval(Duration::ZERO),
            WalRelayConfig::default().with_publish_timeout(Duration::ZERO),
            WalRelayConfig::default().with_publish_concurrency(0),
            WalRelayConfig::default().with_publish_concurrency(MAX_PUBLISH_CONCURRENCY + 1),
        ] {
            assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::Config);
        }
        // The bounds themselves are allowed.
        let second = Duration::from_secs(1);
        for good in [
            WalRelayConfig::default().with_batch_size(outbox_core::store::MAX_CLAIM_BATCH),
            WalRelayConfig::default()
                .with_initial_reconnect_backoff(second)
                .with_max_reconnect_backoff(second),
            WalRelayConfig::default().with_publish_timeout(Duration::from_millis(1)),
            WalRelayConfig::default().with_publish_concurrency(1),
            WalRelayConfig::default().with_publish_concurrency(MAX_PUBLISH_CONCURRENCY),
        ] {
            assert!(good.validate().is_ok());
        }
    }

    #[test]
    fn debug_names_the_target_without_its_password() {
        let t =
            ReplicationTarget::from_url("postgres://relay:s3cret@db.internal/shop?sslmode=disable");
        let text = format!("{:?}", t.unwrap());
        assert!(
            text.contains("db.internal") && text.contains("shop"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[test]
    fn urls() {
        let t = ReplicationTarget::from_url("postgresql://u%40x:p%2Fw@127.0.0.1").unwrap();
        assert_eq!(t.user(), "u@x");
        assert_eq!(t.password(), "p/w");
        assert_eq!(t.database(), "u@x");
        assert_eq!(t.port(), 5432);
        // `+` and `&` are themselves in userinfo (no form decoding), escapes decode.
        let t = ReplicationTarget::from_url("postgres://u:a+b&c%2Bd%26e@h/d+b").unwrap();
        assert_eq!(t.password(), "a+b&c+d&e");
        assert_eq!(t.database(), "d+b");
        let t = ReplicationTarget::from_url("postgres://u@[::1]:7/db?sslmode=disable").unwrap();
        assert_eq!((t.host(), t.port(), t.database()), ("::1", 7, "db"));
        assert_eq!(t.sslmode(), "disable");
        assert_eq!(t.tls(), pgwire_replication::TlsConfig::disabled());
        for bad in [
            "mysql://u@h/db",
            "postgres://h/db",
            "not a url",
            "postgres://u@h/db?sslmode=sometimes",
            "postgres://u@h/db?sslmode=require&sslcert=/c.pem&sslkey=/k.pem",
            "postgres://u:%ff@h/db",
        ] {
            assert_eq!(
                ReplicationTarget::from_url(bad).unwrap_err().kind(),
                ErrorKind::Config,
                "{bad}"
            );
        }
    }

    #[test]
    fn sslmodes() {
        use pgwire_replication::SslMode as Wire;
        let mode = |url: &str| ReplicationTarget::from_url(url).map(|t| (t.sslmode(), t.tls()));
        let (name, _) = mode("postgres://u@h/db").unwrap();
        assert_eq!(name, "prefer", "libpq's default");
        assert_eq!(mode("postgres://u@h/db?sslmode=allow").unwrap().0, "prefer");
        let tls_modes = [
            ("require", Wire::Require),
            ("verify-ca", Wire::VerifyCa),
            ("verify-full", Wire::VerifyFull),
        ];
        for (value, wire) in tls_modes {
            let url = format!("postgres://u@h/db?sslmode={value}&sslrootcert=/etc/ca.pem");
            if cfg!(feature = "tls") {
                let (name, tls) = mode(&url).unwrap();
                assert_eq!((name, tls.mode), (value, wire));
                if value != "require" {
                    assert_eq!(
                        tls.ca_pem_path.as_deref(),
                        Some(std::path::Path::new("/etc/ca.pem"))
                    );
                }
            } else {
                assert_eq!(mode(&url).unwrap_err().kind(), ErrorKind::Config);
            }
        }
        if cfg!(feature = "tls") {
            assert_eq!(mode("postgres://u@h/db").unwrap().1.mode, Wire::Prefer);
        }
    }
}
