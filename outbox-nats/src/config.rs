//! [`NatsPublisherConfig`]: where to connect, how to authenticate, how destinations
//! become subjects, and how many acks may be outstanding.

use std::fmt;
use std::time::Duration;

use outbox_core::{Error, Result};

/// The default bound on outstanding `PubAck`s per publisher: above what a polling relay
/// at its defaults keeps in flight (pipeline depth 2 × 4 calls × 100 messages), so the
/// window does not throttle it. At 256 (the earlier default) the publisher alone ran at
/// 0.73 of the raw client at batch 1000, at 1024 at 0.97 (`broker_bench`'s profile
/// mode, median of three).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;
/// The largest `max_in_flight` accepted.
pub const MAX_IN_FLIGHT: usize = 65_536;
/// The default wait for one `PubAck`.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The default wait for the first connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the client authenticates. Never printed.
#[derive(Clone, Default, PartialEq, Eq)]
enum Auth {
    #[default]
    None,
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
}

/// Settings of a [`NatsPublisher`](crate::NatsPublisher).
///
/// ```
/// use std::time::Duration;
/// use outbox_nats::NatsPublisherConfig;
///
/// let config = NatsPublisherConfig::new("nats://127.0.0.1:4222")
///     .with_user_and_password("relay", "s3cret")
///     .with_subject_prefix("outbox")
///     .with_max_in_flight(512)
///     .with_ack_timeout(Duration::from_secs(2));
/// config.validate()?;
/// assert_eq!(config.subject_for("orders.created")?, "outbox.orders.created");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
///
/// `Debug` never prints the password, the token, or credentials inside the URL.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsPublisherConfig {
    url: String,
    auth: Auth,
    subject_prefix: Option<String>,
    max_in_flight: usize,
    ack_timeout: Duration,
    connect_timeout: Duration,
    client_name: Option<String>,
}

impl NatsPublisherConfig {
    /// Connect to `url` (`nats://host:port`, or several separated by commas; a
    /// `nats://user:password@host` form works too and is redacted in `Debug`).
    pub fn new(url: impl Into<String>) -> Self {
        NatsPublisherConfig {
            url: url.into(),
            auth: Auth::None,
            subject_prefix: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            client_name: None,
        }
    }

    /// Authenticate with a user and password.
    #[must_use]
    pub fn with_user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.auth = Auth::UserPassword {
            user: user.into(),
            password: password.into(),
        };
        self
    }

    /// Authenticate with a token.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Token(token.into());
        self
    }

    /// Publish destination `d` to subject `<prefix>.d` instead of `d` (no prefix by
    /// default). The prefix is one or more subject tokens, without wildcards.
    #[must_use]
    pub fn with_subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.subject_prefix = Some(prefix.into());
        self
    }

    /// At most this many `PubAck`s outstanding for the publisher, across all its
    /// concurrent calls (default [`DEFAULT_MAX_IN_FLIGHT`], at most [`MAX_IN_FLIGHT`]).
    /// A batch larger than this is published in a sliding window.
    #[must_use]
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// How long to wait for one message's `PubAck` before reporting it retryable
    /// (default [`DEFAULT_ACK_TIMEOUT`]).
    #[must_use]
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// How long [`NatsPublisher::connect`](crate::NatsPublisher::connect) waits for the
    /// first connection (default [`DEFAULT_CONNECT_TIMEOUT`]). Later reconnects go on
    /// in the background for as long as the publisher lives.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The client name the server shows in its connection list.
    #[must_use]
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = Some(name.into());
        self
    }

    /// The server URL(s), as given (credentials included: do not log it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The subject prefix, if any.
    pub fn subject_prefix(&self) -> Option<&str> {
        self.subject_prefix.as_deref()
    }

    /// The bound on outstanding `PubAck`s.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The wait for one `PubAck`.
    pub fn ack_timeout(&self) -> Duration {
        self.ack_timeout
    }

    /// The wait for the first connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The client name, if any.
    pub fn client_name(&self) -> Option<&str> {
        self.client_name.as_deref()
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an empty URL, a prefix
    /// that is not a wildcard-free subject, `max_in_flight` outside
    /// `1..=`[`MAX_IN_FLIGHT`], or a zero timeout.
    pub fn validate(&self) -> Result<()> {
        if self.url.trim().is_empty() {
            return Err(Error::config("the NATS server URL is empty"));
        }
        if let Some(prefix) = &self.subject_prefix {
            check_subject(prefix)
                .map_err(|why| Error::config(format!("subject prefix {prefix:?} {why}")))?;
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return Err(Error::config(format!(
                "max_in_flight is {}; it must be between 1 and {MAX_IN_FLIGHT}",
                self.max_in_flight
            )));
        }
        if self.ack_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::config("ack and connect timeouts must be above zero"));
        }
        Ok(())
    }

    /// The subject a message to `destination` is published to: the destination itself,
    /// or `<prefix>.<destination>`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) when the
    /// destination is not a wildcard-free subject (empty tokens, whitespace, control
    /// characters, a `*` or `>` token).
    pub fn subject_for(&self, destination: &str) -> Result<String> {
        check_subject(destination).map_err(|why| {
            Error::invalid_input(format!(
                "destination {destination:?} {why}, so it cannot be a NATS subject"
            ))
        })?;
        Ok(match &self.subject_prefix {
            Some(prefix) => format!("{prefix}.{destination}"),
            None => destination.to_owned(),
        })
    }

    pub(crate) fn connect_options(&self) -> async_nats::ConnectOptions {
        let mut options = match &self.auth {
            Auth::None => async_nats::ConnectOptions::new(),
            Auth::UserPassword { user, password } => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            Auth::Token(token) => async_nats::ConnectOptions::with_token(token.clone()),
        };
        options = options
            .connection_timeout(self.connect_timeout)
            // Reconnect forever: a relay outlives broker restarts.
            .max_reconnects(None);
        if let Some(name) = &self.client_name {
            options = options.name(name);
        }
        options
    }
}

/// Why `subject` is not a publishable subject, if it is not.
fn check_subject(subject: &str) -> std::result::Result<(), &'static str> {
    if subject.is_empty() {
        return Err("is empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("holds whitespace or control characters");
    }
    for token in subject.split('.') {
        match token {
            "" => return Err("has an empty token (a leading, trailing or doubled '.')"),
            "*" | ">" => return Err("holds a wildcard token"),
            _ => {}
        }
    }
    Ok(())
}

/// `url` with the user-info part of each server address replaced.
fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|server| {
            let (scheme, rest) = match server.find("://") {
                Some(i) => server.split_at(i + 3),
                None => ("", server),
            };
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}<redacted>{}", &rest[at..]),
                None => server.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Debug for NatsPublisherConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            Auth::None => "none".to_owned(),
            Auth::UserPassword { user, .. } => format!("user {user:?}, password <redacted>"),
            Auth::Token(_) => "token <redacted>".to_owned(),
        };
        f.debug_struct("NatsPublisherConfig")
            .field("url", &redact_url(&self.url))
            .field("auth", &format_args!("{auth}"))
            .field("subject_prefix", &self.subject_prefix)
            .field("max_in_flight", &self.max_in_flight)
            .field("ack_timeout", &self.ack_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("client_name", &self.client_name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn debug_redacts_every_secret() {
        let config = NatsPublisherConfig::new("nats://alice:pw1@a:4222,tls://bob:pw2@b:4222/x")
            .with_user_and_password("relay", "pw3");
        let printed = format!("{config:?}");
        for secret in ["pw1", "pw2", "pw3", "alice", "bob"] {
            assert!(!printed.contains(secret), "{secret} in {printed}");
        }
        assert!(printed.contains("<redacted>@a:4222"), "{printed}");
        assert!(printed.contains("\"relay\""), "{printed}");
        let token = format!("{:?}", NatsPublisherConfig::new("n:4222").with_token("tok"));
        assert!(
            !token.contains("tok\"") && token.contains("token <redacted>"),
            "{token}"
        );
        assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
        assert_eq!(redact_url("u:p@h:4222"), "<redacted>@h:4222");
    }

    #[test]
    fn subjects_map_from_destinations() {
        let plain = NatsPublisherConfig::new("nats://h");
        assert_eq!(
            plain.subject_for("orders.created").unwrap(),
            "orders.created"
        );
        let prefixed = plain.clone().with_subject_prefix("app.outbox");
        assert_eq!(prefixed.subject_for("orders").unwrap(), "app.outbox.orders");
        for bad in ["", "a..b", ".a", "a.", "a b", "a.*", ">", "a\tb", "a.>.b"] {
            let err = prefixed.subject_for(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        assert!(prefixed.subject_for("a*b.c-d_e:f").is_ok());
    }

    #[test]
    fn validate_checks_every_setting() {
        let ok = NatsPublisherConfig::new("nats://h");
        ok.validate().unwrap();
        let bad = [
            NatsPublisherConfig::new(" "),
            ok.clone().with_subject_prefix("a."),
            ok.clone().with_subject_prefix("a.>"),
            ok.clone().with_max_in_flight(0),
            ok.clone().with_max_in_flight(MAX_IN_FLIGHT + 1),
            ok.clone().with_ack_timeout(Duration::ZERO),
            ok.clone().with_connect_timeout(Duration::ZERO),
        ];
        for config in bad {
            assert_eq!(
                config.validate().unwrap_err().kind(),
                ErrorKind::Config,
                "{config:?}"
            );
        }
        ok.with_max_in_flight(MAX_IN_FLIGHT).validate().unwrap();
    }
}
