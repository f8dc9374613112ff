//! [`RabbitPublisherConfig`] and the destination mapping, [`Routing`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lapin::uri::{AMQPScheme, AMQPUri};
use outbox_core::{Error, Message, Result};

/// The longest exchange name, routing key, content type or header name AMQP 0-9-1
/// carries: they are `shortstr`s, at most 255 bytes.
pub const MAX_SHORT_STRING: usize = 255;

/// Where one message goes: an exchange and a routing key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// The exchange; `""` is the default exchange, which routes a message to the queue
    /// named by its routing key.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
}

impl Route {
    /// A route, checked: both names at most [`MAX_SHORT_STRING`] bytes.
    ///
    /// # Errors
    /// The reason, for a [`Permanent`](outbox_core::PublishOutcome::Permanent) outcome.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> std::result::Result<Route, String> {
        let route = Route {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        };
        if route.exchange.len() > MAX_SHORT_STRING {
            return Err(format!(
                "exchange name of {} bytes is over AMQP's {MAX_SHORT_STRING}",
                route.exchange.len()
            ));
        }
        if route.routing_key.len() > MAX_SHORT_STRING {
            return Err(format!(
                "routing key of {} bytes is over AMQP's {MAX_SHORT_STRING}",
                route.routing_key.len()
            ));
        }
        Ok(route)
    }
}

type RouteFn = dyn Fn(&Message) -> std::result::Result<Route, String> + Send + Sync;

/// How a message's [`destination`](Message::destination) becomes an exchange and a
/// routing key.
///
/// | mapping | destination | exchange | routing key |
/// |---|---|---|---|
/// | [`default_exchange`](Self::default_exchange) (the default) | `orders` | `""` (default exchange) | `orders`: the queue `orders` |
/// | [`exchange("events")`](Self::exchange) | `orders.created` | `events` | `orders.created` |
/// | [`split('/')`](Self::split) | `events/orders.created` | `events` | `orders.created` |
/// | [`split('/')`](Self::split) | `orders` | `""` (default exchange) | `orders` |
/// | [`custom(f)`](Self::custom) | anything | what `f` returns | what `f` returns |
///
/// The default is the default exchange because it is the only exchange every broker
/// has: a destination names a queue, and with `mandatory` set a destination without
/// a queue comes back as [`Permanent`](outbox_core::PublishOutcome::Permanent) instead of
/// vanishing. For publish/subscribe, declare a topic exchange, bind your queues to it
/// and use [`exchange`](Self::exchange): destinations then become routing keys such as
/// `orders.created`.
///
/// The publisher never declares exchanges, queues or bindings: topology belongs to the
/// operator or the consumers. A message whose exchange does not exist, or that no queue
/// is bound for, is `Permanent`.
#[derive(Clone)]
pub struct Routing(Inner);

#[derive(Clone)]
enum Inner {
    Exchange(String),
    Split(char),
    Custom(Arc<RouteFn>),
}

impl Routing {
    /// The default exchange (`""`): the destination is the routing key, which names a
    /// queue. The default mapping.
    pub fn default_exchange() -> Routing {
        Routing(Inner::Exchange(String::new()))
    }

    /// Every message to `exchange`, with its destination as the routing key.
    pub fn exchange(exchange: impl Into<String>) -> Routing {
        Routing(Inner::Exchange(exchange.into()))
    }

    /// The destination is `exchange<separator>routing-key`, split at the first
    /// `separator`; a destination without one goes to the default exchange whole.
    pub fn split(separator: char) -> Routing {
        Routing(Inner::Split(separator))
    }

    /// Your own mapping. An `Err` is the reason the message is
    /// [`Permanent`](outbox_core::PublishOutcome::Permanent); build routes with
    /// [`Route::new`] to get the length checks.
    pub fn custom(
        route: impl Fn(&Message) -> std::result::Result<Route, String> + Send + Sync + 'static,
    ) -> Routing {
        Routing(Inner::Custom(Arc::new(route)))
    }

    /// Where `message` goes.
    ///
    /// # Errors
    /// Why the message cannot be routed (a name over [`MAX_SHORT_STRING`] bytes, or the
    /// custom mapping's reason).
    pub fn route(&self, message: &Message) -> std::result::Result<Route, String> {
        let destination = message.destination.as_str();
        let route = match &self.0 {
            Inner::Exchange(exchange) => Route::new(exchange.as_str(), destination)?,
            Inner::Split(separator) => match destination.split_once(*separator) {
                Some((exchange, key)) => Route::new(exchange, key)?,
                None => Route::new("", destination)?,
            },
            Inner::Custom(route) => route(message)?,
        };
        // A custom mapping may build a `Route` by hand: check it here too.
        Route::new(route.exchange, route.routing_key)
    }
}

impl Default for Routing {
    fn default() -> Self {
        Routing::default_exchange()
    }
}

impl fmt::Debug for Routing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::Exchange(name) => f.debug_tuple("Exchange").field(name).finish(),
            Inner::Split(separator) => f.debug_tuple("Split").field(separator).finish(),
            Inner::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// Settings of a [`RabbitPublisher`](crate::RabbitPublisher).
///
/// ```
/// use std::time::Duration;
/// use outbox_rabbitmq::{RabbitPublisherConfig, Routing};
///
/// let config = RabbitPublisherConfig::new("amqp://app:s3cret@rabbit:5672/%2f")
///     .with_routing(Routing::exchange("events"))
///     .with_max_in_flight(500)
///     .with_connect_timeout(Duration::from_secs(3));
/// config.validate()?;
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RabbitPublisherConfig {
    url: String,
    routing: Routing,
    max_in_flight: usize,
    connect_timeout: Duration,
    publish_timeout: Duration,
    connection_name: String,
}

impl RabbitPublisherConfig {
    /// Settings for the broker at `url`, an AMQP URI such as
    /// `amqp://guest:guest@127.0.0.1:5672/%2f` (the vhost is URL-encoded: `%2f` is `/`).
    ///
    /// Defaults: [`Routing::default_exchange`], 1,024 confirms in flight, 5 s to connect,
    /// 5 s to publish a batch, connection name `outbox-rabbitmq`.
    pub fn new(url: impl Into<String>) -> Self {
        RabbitPublisherConfig {
            url: url.into(),
            routing: Routing::default(),
            max_in_flight: 1024,
            connect_timeout: Duration::from_secs(5),
            publish_timeout: Duration::from_secs(5),
            connection_name: "outbox-rabbitmq".to_owned(),
        }
    }

    /// How destinations map to exchanges and routing keys.
    #[must_use]
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// The most messages of one batch published and not yet confirmed; at least 1.
    #[must_use]
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// The longest a publish call waits to get a usable connection and channel:
    /// waiting for another call's reconnect, the reconnect itself, opening a channel.
    /// Past it the batch is [`Retryable`](outbox_core::PublishOutcome::Retryable).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest a publish call waits, once it has a channel, for its messages to be
    /// written and confirmed. Messages without a confirm by then are
    /// [`Retryable`](outbox_core::PublishOutcome::Retryable).
    ///
    /// Keep `connect_timeout + publish_timeout` within the relay's
    /// `RelayConfig::publish_timeout`, so the publisher reports per-message outcomes
    /// before the relay gives up on the call (which is safe too: the call's channel is
    /// closed).
    #[must_use]
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// The connection name shown by `rabbitmqctl list_connections client_properties`
    /// and the management UI. Give each relay process its own.
    #[must_use]
    pub fn with_connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The AMQP URI. It may hold a password: do not log it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The destination mapping.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// The most unconfirmed messages per batch.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// See [`with_connect_timeout`](Self::with_connect_timeout).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// See [`with_publish_timeout`](Self::with_publish_timeout).
    pub fn publish_timeout(&self) -> Duration {
        self.publish_timeout
    }

    /// The connection name.
    pub fn connection_name(&self) -> &str {
        &self.connection_name
    }

    /// Check the settings.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config): an unparsable URI, zero
    /// confirms in flight, a zero timeout, a connection name or exchange name over 255
    /// bytes, or an `amqps://` URI (this crate is built without TLS).
    pub fn validate(&self) -> Result<()> {
        if self.parsed_url()?.scheme == AMQPScheme::AMQPS {
            return Err(Error::config(
                "amqps:// is not supported: this crate is built without TLS; use amqp:// \
                 (or terminate TLS in a sidecar)",
            ));
        }
        if self.max_in_flight == 0 {
            return Err(Error::config("max_in_flight must be at least 1"));
        }
        if self.connect_timeout.is_zero() || self.publish_timeout.is_zero() {
            return Err(Error::config(
                "connect_timeout and publish_timeout must be above zero",
            ));
        }
        if self.connection_name.len() > MAX_SHORT_STRING {
            return Err(Error::config(format!(
                "connection name of {} bytes is over {MAX_SHORT_STRING}",
                self.connection_name.len()
            )));
        }
        if let Inner::Exchange(exchange) = &self.routing.0 {
            if exchange.len() > MAX_SHORT_STRING {
                return Err(Error::config(format!(
                    "exchange name of {} bytes is over AMQP's {MAX_SHORT_STRING}",
                    exchange.len()
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn parsed_url(&self) -> Result<AMQPUri> {
        // The parser's message may quote the URI, password included: leave it out.
        AMQPUri::from_str(&self.url).map_err(|_| {
            Error::config(format!(
                "not an AMQP URI: {} (expected amqp://user:password@host:port/vhost)",
                redact_url(&self.url)
            ))
        })
    }
}

impl fmt::Debug for RabbitPublisherConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisherConfig")
            .field("url", &redact_url(&self.url))
            .field("routing", &self.routing)
            .field("max_in_flight", &self.max_in_flight)
            .field("connect_timeout", &self.connect_timeout)
            .field("publish_timeout", &self.publish_timeout)
            .field("connection_name", &self.connection_name)
            .finish()
    }
}

/// `url` with the password of its user info replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let redacted = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{redacted}{tail}"),
        None => format!("{redacted}{tail}"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use outbox_core::backend::MessageParts;
    use outbox_core::{Headers, MessageId};

    use super::*;

    fn message(destination: &str) -> Message {
        Message::from(MessageParts {
            id: MessageId::new(),
            destination: destination.into(),
            partition_key: None,
            payload: Vec::new(),
            content_type: None,
            headers: Headers::new(),
            created_at: SystemTime::now(),
            attempts: 1,
            last_error: None,
        })
    }

    fn route(exchange: &str, key: &str) -> Route {
        Route::new(exchange, key).unwrap()
    }

    #[test]
    fn mappings_follow_the_documented_table() {
        let m = message("orders.created");
        assert_eq!(
            Routing::default().route(&m),
            Ok(route("", "orders.created"))
        );
        assert_eq!(
            Routing::exchange("events").route(&m),
            Ok(route("events", "orders.created"))
        );
        assert_eq!(
            Routing::split('/').route(&message("events/orders.created")),
            Ok(route("events", "orders.created"))
        );
        assert_eq!(
            Routing::split('/').route(&message("events/a/b")),
            Ok(route("events", "a/b"))
        );
        assert_eq!(
            Routing::split('/').route(&m),
            Ok(route("", "orders.created"))
        );
        let custom = Routing::custom(|m| Route::new("x", m.destination.to_uppercase()));
        assert_eq!(custom.route(&m), Ok(route("x", "ORDERS.CREATED")));
        let refusing = Routing::custom(|_| Err("no route for you".into()));
        assert_eq!(refusing.route(&m), Err("no route for you".into()));
    }

    #[test]
    fn over_long_names_are_refused_not_truncated() {
        let long = "k".repeat(MAX_SHORT_STRING + 1);
        let reason = Routing::default().route(&message(&long)).unwrap_err();
        assert!(reason.contains("routing key of 256 bytes"), "{reason}");
        let by_hand = Routing::custom(move |_| {
            Ok(Route {
                exchange: "e".repeat(300),
                routing_key: "k".into(),
            })
        });
        let reason = by_hand.route(&message("d")).unwrap_err();
        assert!(reason.contains("exchange name of 300 bytes"), "{reason}");
    }

    #[test]
    fn validate_checks_each_setting() {
        let ok = RabbitPublisherConfig::new("amqp://guest:guest@127.0.0.1:5672/%2f");
        ok.validate().unwrap();
        let kind = |c: RabbitPublisherConfig| c.validate().unwrap_err().kind();
        assert_eq!(
            kind(ok.clone().with_max_in_flight(0)),
            outbox_core::ErrorKind::Config
        );
        assert_eq!(
            kind(ok.clone().with_connect_timeout(Duration::ZERO)),
            outbox_core::ErrorKind::Config
        );
        assert_eq!(
            kind(ok.clone().with_publish_timeout(Duration::ZERO)),
            outbox_core::ErrorKind::Config
        );
        assert_eq!(
            kind(ok.clone().with_connection_name("n".repeat(256))),
            outbox_core::ErrorKind::Config
        );
        assert_eq!(
            kind(ok.clone().with_routing(Routing::exchange("e".repeat(256)))),
            outbox_core::ErrorKind::Config
        );
        assert_eq!(
            kind(RabbitPublisherConfig::new(
                "amqps://guest:guest@rabbit:5671/%2f"
            )),
            outbox_core::ErrorKind::Config
        );
        let bad = RabbitPublisherConfig::new("http://user:hunter2@host:99999/");
        let err = bad.validate().unwrap_err();
        assert_eq!(err.kind(), outbox_core::ErrorKind::Config);
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_redacts_the_password() {
        let config = RabbitPublisherConfig::new("amqp://app:s3cr:et@rabbit:5672/%2f?heartbeat=10");
        let printed = format!("{config:?}");
        assert!(!printed.contains("s3cr"), "{printed}");
        assert!(
            printed.contains("amqp://app:***@rabbit:5672/%2f?heartbeat=10"),
            "{printed}"
        );
        assert_eq!(redact_url("amqp://rabbit/%2f"), "amqp://rabbit/%2f");
        assert_eq!(redact_url("amqp://user@rabbit"), "amqp://user@rabbit");
        assert_eq!(
            redact_url("amqps://u:p@ss@rabbit:5671"),
            "amqps://u:***@rabbit:5671"
        );
        assert_eq!(redact_url("u:p@rabbit"), "u:***@rabbit");
    }
}
