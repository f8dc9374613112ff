//! [`RabbitPublisher`]: publishing one batch on a confirm channel.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Confirmation, PublisherConfirm};
use outbox_core::{
    publisher::OutcomeCounts, Error, ErrorKind, Message, PublishOutcome, Publisher, Result,
};
use tokio::time::{timeout_at, Instant};
use tracing::Instrument;

use crate::config::{RabbitPublisherConfig, Route};
use crate::error;
use crate::properties::properties;
use crate::session::{Connector, Lease, Session};

/// Publishes outbox messages to RabbitMQ with publisher confirms.
///
/// Each message becomes one `basic.publish`, `mandatory`, to the exchange and routing
/// key [`Routing`](crate::Routing) gives, with these properties:
///
/// | AMQP | from the message |
/// |---|---|
/// | `message-id` | [`id`](outbox_core::Message::id), as the UUID's text: the id consumers deduplicate on |
/// | `delivery-mode` | 2 ([`PERSISTENT`](crate::PERSISTENT)) |
/// | `content-type` | [`content_type`](outbox_core::Message::content_type), when set |
/// | `timestamp` | [`created_at`](outbox_core::Message::created_at), in whole seconds |
/// | `headers` | every header, as a long string; the partition key as [`PARTITION_KEY_HEADER`](crate::PARTITION_KEY_HEADER) |
///
/// The payload is the message body, byte for byte.
///
/// # Outcomes
///
/// One per message, in batch order:
///
/// - `basic.ack` → [`Published`](PublishOutcome::Published): the broker routed the
///   message and, for durable queues, wrote it to disk.
/// - `basic.return` (no queue bound for the routing key), a missing exchange, or a name
///   over AMQP's 255 bytes → [`Permanent`](PublishOutcome::Permanent). A returned message
///   is matched to its batch entry by its `message-id`, so it never marks another.
/// - `basic.nack`, a lost connection or channel, no connection within
///   [`connect_timeout`](crate::RabbitPublisherConfig::with_connect_timeout), no confirm
///   within [`publish_timeout`](crate::RabbitPublisherConfig::with_publish_timeout) →
///   [`Retryable`](PublishOutcome::Retryable).
///
/// `publish` never returns `Err`: every failure is reported per message.
///
/// # Connections
///
/// The publisher holds one connection, opened on the first publish (or by
/// [`connect`](Self::connect)) and reopened lazily by the first publish after it failed;
/// concurrent calls share the reconnect rather than each trying. Each call borrows a
/// confirm channel of its own, so calls from several tasks run in parallel and their
/// confirms and returns never mix. Cancelling a call (dropping its future) closes its
/// channel; nothing is left behind that blocks a later publish.
#[derive(Clone)]
pub struct RabbitPublisher {
    connector: Arc<Connector>,
}

impl RabbitPublisher {
    /// A publisher that connects on its first publish.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) from
    /// [`RabbitPublisherConfig::validate`].
    pub fn new(config: RabbitPublisherConfig) -> Result<Self> {
        config.validate()?;
        Ok(RabbitPublisher {
            connector: Arc::new(Connector::new(config)),
        })
    }

    /// A publisher that connects now, so bad settings fail at startup.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for invalid settings, an
    /// unknown vhost or refused credentials;
    /// [`Unavailable`](outbox_core::ErrorKind::Unavailable) or
    /// [`Timeout`](outbox_core::ErrorKind::Timeout) when the broker cannot be reached
    /// within the connect timeout.
    pub async fn connect(config: RabbitPublisherConfig) -> Result<Self> {
        let publisher = RabbitPublisher::new(config)?;
        let deadline = Instant::now() + publisher.config().connect_timeout();
        publisher.connector.session(deadline).await?;
        Ok(publisher)
    }

    /// The settings.
    pub fn config(&self) -> &RabbitPublisherConfig {
        self.connector.config()
    }

    /// Whether the publisher holds an open connection now. `false` before the first
    /// publish and after the connection dropped, until the next publish reconnects: a
    /// readiness probe, not a reason to stop publishing.
    pub fn is_connected(&self) -> bool {
        self.connector.usable().is_some()
    }

    /// Close the connection gracefully (for shutdown). A later publish reconnects.
    ///
    /// # Errors
    /// When the broker did not acknowledge the close; the connection is dropped anyway.
    pub async fn close(&self) -> Result<()> {
        self.connector.close().await
    }
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("config", self.config())
            .field("connected", &self.is_connected())
            .finish()
    }
}

#[async_trait]
impl Publisher for RabbitPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let span = tracing::info_span!(
            "outbox.rabbitmq.publish",
            messages = batch.len(),
            published = tracing::field::Empty,
            retryable = tracing::field::Empty,
            permanent = tracing::field::Empty,
        );
        let outcomes = Batch::new(batch, self.config().publish_timeout())
            .run(&self.connector)
            .instrument(span.clone())
            .await;
        let counts = OutcomeCounts::of(&outcomes);
        counts.record(&span);
        if counts.published < outcomes.len() {
            let first = outcomes.iter().find_map(|o| match o {
                PublishOutcome::Retryable(r) | PublishOutcome::Permanent(r) => Some(r.as_str()),
                PublishOutcome::Published => None,
            });
            span.in_scope(|| {
                tracing::warn!(
                    published = counts.published,
                    retryable = counts.retryable,
                    permanent = counts.permanent,
                    first_reason = first.unwrap_or_default(),
                    "RabbitMQ did not take every message of the batch"
                );
            });
        }
        Ok(outcomes)
    }
}

/// A message ready to send.
struct Prepared {
    route: Route,
    properties: BasicProperties,
}

/// One publish call: the messages, what became of each so far, and what is left to
/// send.
struct Batch<'a> {
    messages: &'a [Message],
    outcomes: Vec<Option<PublishOutcome>>,
    prepared: Vec<Option<Prepared>>,
    returned: Vec<BasicReturnMessage>,
    /// For timeout messages.
    publish_timeout: Duration,
}

impl<'a> Batch<'a> {
    fn new(messages: &'a [Message], publish_timeout: Duration) -> Self {
        Batch {
            publish_timeout,
            messages,
            outcomes: vec![None; messages.len()],
            prepared: messages.iter().map(|_| None).collect(),
            returned: Vec::new(),
        }
    }

    async fn run(mut self, connector: &Connector) -> Vec<PublishOutcome> {
        let config = connector.config();
        for (i, message) in self.messages.iter().enumerate() {
            let prepared = config.routing().route(message).and_then(|route| {
                Ok(Prepared {
                    route,
                    properties: properties(message)?,
                })
            });
            match prepared {
                Ok(p) => self.prepared[i] = Some(p),
                Err(reason) => self.outcomes[i] = Some(PublishOutcome::Permanent(reason)),
            }
        }
        if self.prepared.iter().any(Option::is_some) {
            if let Err(err) = self.send(connector).await {
                self.fail_unsettled(&err);
            }
        }
        self.finish()
    }

    /// Connect, check exchanges, publish and await confirms. `Err` is a failure of the
    /// connection or channel: what it left unsettled is retryable.
    async fn send(&mut self, connector: &Connector) -> Result<()> {
        let config = connector.config();
        let connect_deadline = Instant::now() + config.connect_timeout();
        let session = connector.session(connect_deadline).await?;
        let result = self.send_on(&session, config, connect_deadline).await;
        if let Err(err) = &result {
            if err.kind() == ErrorKind::Timeout {
                // Open by lapin's account, but silent: do not reuse it.
                connector.discard(&session);
            }
        }
        result
    }

    async fn send_on(
        &mut self,
        session: &Arc<Session>,
        config: &RabbitPublisherConfig,
        connect_deadline: Instant,
    ) -> Result<()> {
        let lease = session.channel(connect_deadline).await?;
        let deadline = Instant::now() + config.publish_timeout();
        self.check_exchanges(session, deadline).await?;
        let result = self
            .publish_all(&lease, config.max_in_flight(), deadline)
            .await;
        self.apply_returns();
        match &result {
            Ok(()) => lease.release(),
            Err(_) => drop(lease), // closes the channel
        }
        result
    }

    /// Mark messages to exchanges that do not exist `Permanent`.
    async fn check_exchanges(&mut self, session: &Session, deadline: Instant) -> Result<()> {
        let mut unknown: Vec<String> = Vec::new();
        for p in self.prepared.iter().flatten() {
            if !session.knows_exchange(&p.route.exchange) && !unknown.contains(&p.route.exchange) {
                unknown.push(p.route.exchange.clone());
            }
        }
        for exchange in unknown {
            if session.exchange_exists(&exchange, deadline).await? {
                continue;
            }
            for i in 0..self.prepared.len() {
                if self.prepared[i]
                    .as_ref()
                    .is_some_and(|p| p.route.exchange == exchange)
                {
                    self.prepared[i] = None;
                    self.outcomes[i] = Some(PublishOutcome::Permanent(format!(
                        "exchange {exchange:?} does not exist (404 NOT_FOUND); the publisher \
                         does not declare exchanges"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Publish what is prepared, at most `max_in_flight` unconfirmed, then await the
    /// remaining confirms.
    async fn publish_all(
        &mut self,
        lease: &Lease,
        max_in_flight: usize,
        deadline: Instant,
    ) -> Result<()> {
        let channel = lease.channel();
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut pending: VecDeque<(usize, PublisherConfirm)> = VecDeque::new();
        let mut failure = None;
        for i in 0..self.messages.len() {
            let Some(Prepared { route, properties }) = self.prepared[i].take() else {
                continue;
            };
            if pending.len() >= max_in_flight {
                if let Some((j, confirm)) = pending.pop_front() {
                    if let Err(err) = self.settle(lease, j, confirm, deadline).await {
                        failure = Some(err);
                        break;
                    }
                }
            }
            let exchange: ShortString = route.exchange.into();
            let routing_key: ShortString = route.routing_key.into();
            let messages = self.messages;
            let payload = &messages[i].payload;
            let sent = timeout_at(
                deadline,
                channel.basic_publish(exchange, routing_key, options, payload, properties),
            )
            .await;
            match sent {
                Ok(Ok(confirm)) => pending.push_back((i, confirm)),
                Ok(Err(e)) => {
                    failure = Some(error::from_lapin("publishing", e));
                    break;
                }
                Err(_) => {
                    failure = Some(error::timeout("publishing", self.publish_timeout));
                    break;
                }
            }
        }
        // Settle everything sent, even after a failure: confirms that arrived count.
        // Past the deadline each await only collects what is already there.
        for (j, confirm) in pending {
            if let Err(err) = self.settle(lease, j, confirm, deadline).await {
                failure.get_or_insert(err);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Await message `i`'s confirm and record its outcome. `Err` when the channel failed
    /// or the deadline passed: the message is already marked retryable.
    async fn settle(
        &mut self,
        lease: &Lease,
        i: usize,
        confirm: PublisherConfirm,
        deadline: Instant,
    ) -> Result<()> {
        let (outcome, result) = match timeout_at(deadline, confirm).await {
            Ok(Ok(Confirmation::Ack(returned))) => {
                self.returned.extend(returned);
                (PublishOutcome::Published, Ok(()))
            }
            Ok(Ok(Confirmation::Nack(returned))) => {
                self.returned.extend(returned);
                let reason = "the broker nacked the message (basic.nack: it could not take \
                              it, e.g. a queue full with overflow reject-publish)";
                (PublishOutcome::Retryable(reason.to_owned()), Ok(()))
            }
            Ok(Ok(Confirmation::NotRequested)) => (
                PublishOutcome::Retryable("the channel is not in confirm mode".to_owned()),
                Ok(()),
            ),
            Ok(Err(e)) => {
                if error::is_not_found(&e) {
                    // An exchange was deleted under us: check them again next time.
                    lease.session().forget_exchanges();
                }
                let err = error::from_lapin("waiting for the publisher confirm", e);
                (error::outcome_of_failure(&err), Err(err))
            }
            Err(_) => {
                let err = error::timeout("waiting for the publisher confirm", self.publish_timeout);
                (error::outcome_of_failure(&err), Err(err))
            }
        };
        self.outcomes[i] = Some(outcome);
        result
    }

    /// Mark each returned message `Permanent`, found by its `message-id`: lapin hands
    /// a `basic.return` to whichever confirm it completes next, which need not be the
    /// returned message's own.
    fn apply_returns(&mut self) {
        if self.returned.is_empty() {
            return;
        }
        let mut by_id: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, message) in self.messages.iter().enumerate().rev() {
            by_id.entry(message.id.to_string()).or_default().push(i);
        }
        for returned in std::mem::take(&mut self.returned) {
            let id = returned
                .properties
                .message_id()
                .as_ref()
                .map(ShortString::as_str);
            let Some(i) = id.and_then(|id| by_id.get_mut(id)).and_then(Vec::pop) else {
                tracing::warn!(
                    message_id = id.unwrap_or_default(),
                    "RabbitMQ returned a message that is not in this batch; ignored"
                );
                continue;
            };
            self.outcomes[i] = Some(error::returned(
                returned.reply_code,
                returned.reply_text.as_str(),
                returned.exchange.as_str(),
                returned.routing_key.as_str(),
            ));
        }
    }

    /// Every message without an outcome yet is retryable because of `err`.
    fn fail_unsettled(&mut self, err: &Error) {
        let outcome = error::outcome_of_failure(err);
        for slot in self.outcomes.iter_mut().filter(|o| o.is_none()) {
            *slot = Some(outcome.clone());
        }
    }

    fn finish(self) -> Vec<PublishOutcome> {
        self.outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    PublishOutcome::Retryable("not sent: the batch stopped before it".to_owned())
                })
            })
            .collect()
    }
}
