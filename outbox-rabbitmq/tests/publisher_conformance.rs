//! The shared publisher conformance suite (`outbox_testkit::publisher_suite!`) against
//! a real RabbitMQ (`OUTBOX_AMQP_URL`).
//!
//! Each case gets a namespace of its own: a topic exchange and one queue bound to it
//! with `routed.#`. Destinations are `routed.<name>`; `unbound.nowhere` matches no
//! binding, so RabbitMQ returns it. Reading back drains the queue into a cache and
//! picks a destination's messages by routing key, so a case may read a destination
//! more than once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::private::PrivateRabbit;
use outbox_core::{Error, ErrorKind, Publisher, Result};
use outbox_rabbitmq::lapin::message::Delivery;
use outbox_rabbitmq::lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use outbox_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use outbox_rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use outbox_rabbitmq::{RabbitPublisher, RabbitPublisherConfig, Routing};
use outbox_testkit::{PublisherHarness, PublisherNamespace, Received, RestartableNamespace};

struct RabbitHarness {
    url: String,
}

async fn harness() -> Option<RabbitHarness> {
    let url = common::amqp_url()?;
    Some(RabbitHarness { url })
}

outbox_testkit::publisher_suite!(harness; lacks(dedup_window));

fn broker_error(doing: &str, err: outbox_rabbitmq::lapin::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("test broker: {doing}")).with_source(err)
}

#[async_trait]
impl PublisherHarness for RabbitHarness {
    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>> {
        Ok(Box::new(RabbitNamespace::declare(&self.url, None).await?))
    }

    async fn restartable_namespace(&self) -> Result<Box<dyn RestartableNamespace>> {
        let node = PrivateRabbit::start().await?;
        let url = node.url();
        Ok(Box::new(RabbitNamespace::declare(&url, Some(node)).await?))
    }
}

/// The test's own connection and channel, to declare and read back.
async fn open(url: &str) -> Result<(Connection, Channel)> {
    // Bounded: the client can hang instead of failing when a node is starting.
    let connect = Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name(common::unique("conf").into()),
    );
    let connection = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .map_err(|_| Error::new(ErrorKind::Timeout, "test broker: connecting took over 10 s"))?
        .map_err(|e| broker_error("connecting", e))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| broker_error("opening a channel", e))?;
    Ok((connection, channel))
}

struct RabbitNamespace {
    url: String,
    exchange: String,
    queue: String,
    /// The test's connection; reopened when a restart of a private node broke it.
    link: tokio::sync::Mutex<(Connection, Channel)>,
    /// Everything taken from the queue so far, in queue order.
    drained: tokio::sync::Mutex<Vec<Delivery>>,
    /// The private node a restartable namespace runs on, `None` on the shared one.
    node: Option<PrivateRabbit>,
}

impl std::fmt::Debug for RabbitNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitNamespace")
            .field("exchange", &self.exchange)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl RabbitNamespace {
    /// A topic exchange and one durable queue bound to it with `routed.#`. On a private
    /// node the exchange is durable too, so both survive its restart; on the shared one
    /// it is auto-deleted with its binding.
    async fn declare(url: &str, node: Option<PrivateRabbit>) -> Result<Self> {
        let (connection, channel) = open(url).await?;
        let exchange = common::unique("conf-ex");
        let queue = common::unique("conf-q");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: node.is_some(),
                    auto_delete: node.is_none(),
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| broker_error("declaring the exchange", e))?;
        // Left behind by a failed case, the queue expires and the auto-delete exchange
        // goes with its last binding.
        let mut arguments = FieldTable::default();
        arguments.insert("x-expires".into(), AMQPValue::LongLongInt(120_000));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await
            .map_err(|e| broker_error("declaring the queue", e))?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "routed.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| broker_error("binding the queue", e))?;
        Ok(RabbitNamespace {
            url: url.to_owned(),
            exchange,
            queue,
            link: tokio::sync::Mutex::new((connection, channel)),
            drained: tokio::sync::Mutex::new(Vec::new()),
            node,
        })
    }

    /// The test's channel, reopened if a restart closed it.
    async fn channel(&self) -> Result<Channel> {
        self.channel_reopened(false).await
    }

    /// The test's channel, on a new connection when `reopen` is set or the old one is
    /// closed: a connection that a killed node left looking open is not trusted twice.
    async fn channel_reopened(&self, reopen: bool) -> Result<Channel> {
        let mut link = self.link.lock().await;
        if reopen || !link.1.status().connected() {
            *link = open(&self.url).await?;
        }
        Ok(link.1.clone())
    }

    fn node(&self) -> Result<&PrivateRabbit> {
        self.node
            .as_ref()
            .ok_or_else(|| Error::config("this namespace is on the shared node"))
    }
}

#[async_trait]
impl RestartableNamespace for RabbitNamespace {
    async fn stop_broker(&self) -> Result<()> {
        self.node()?.stop().await
    }

    async fn start_broker(&self) -> Result<()> {
        self.node()?.start_again().await?;
        // A restarted node answers AMQP before it routes again: for a moment a
        // mandatory publish to a bound key can come back NO_ROUTE (seen in CI), which
        // the publisher must report Permanent. "Back" is when it routes: probe with a
        // key of its own, which no read-back of a case's destinations returns.
        // Generous: a node that answers AMQP is seconds from routing, but a loaded CI
        // machine has taken over 20 s.
        let deadline = tokio::time::Instant::now() + ROUTE_AGAIN;
        let mut pause = outbox_core::backend::Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
        );
        let mut reopen = false;
        loop {
            match self.routes("routed.probe", reopen).await {
                Probe::Routed => return Ok(()),
                Probe::Returned => reopen = false,
                Probe::Broken => reopen = true,
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the restarted node did not route to the namespace's queue within \
                         {ROUTE_AGAIN:?}"
                    ),
                ));
            }
            pause.wait().await;
        }
    }
}

/// How long a restarted node may take, once it answers AMQP, to route again.
const ROUTE_AGAIN: Duration = Duration::from_secs(60);

/// What one routing probe met.
enum Probe {
    /// Confirmed and not returned: the node routes.
    Routed,
    /// Returned or nacked: the node answers but does not route yet.
    Returned,
    /// The connection failed or the probe hung: the next probe opens a new one.
    Broken,
}

impl RabbitNamespace {
    /// What a mandatory, confirmed publish to `key` met, on a fresh connection when
    /// `reopen` is set. Opening the connection is bounded by [`open`], not by the
    /// probe's own two seconds, so a slow handshake on a node still booting is not
    /// cancelled every time.
    async fn routes(&self, key: &str, reopen: bool) -> Probe {
        let Ok(channel) = self.channel_reopened(reopen).await else {
            return Probe::Broken;
        };
        let probe = async {
            let confirms = channel.clone();
            confirms
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .ok()?;
            let confirm = channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    b"probe",
                    BasicProperties::default(),
                )
                .await
                .ok()?;
            let confirmation = confirm.await.ok()?;
            Some(confirmation.is_ack() && confirmation.take_message().is_none())
        };
        match tokio::time::timeout(Duration::from_secs(2), probe).await {
            Ok(Some(true)) => Probe::Routed,
            Ok(Some(false)) => Probe::Returned,
            Ok(None) | Err(_) => Probe::Broken,
        }
    }
}

fn received(delivery: &Delivery) -> Received {
    let (headers, key) = common::headers(delivery);
    Received::new(delivery.data.clone())
        .with_dedup_id(common::text(delivery.properties.message_id()).map(str::to_owned))
        .with_content_type(common::text(delivery.properties.content_type()).map(str::to_owned))
        .with_partition_key(key)
        .with_headers(headers)
}

#[async_trait]
impl PublisherNamespace for RabbitNamespace {
    async fn publisher(&self) -> Result<Arc<dyn Publisher>> {
        let config = RabbitPublisherConfig::new(self.url.clone())
            .with_routing(Routing::exchange(&self.exchange))
            .with_connection_name(common::unique("conf-publisher"));
        Ok(Arc::new(RabbitPublisher::connect(config).await?))
    }

    fn destination(&self, name: &str) -> String {
        format!("routed.{name}")
    }

    fn unroutable_destination(&self) -> String {
        "unbound.nowhere".to_owned()
    }

    async fn received(&self, destination: &str) -> Result<Vec<Received>> {
        let mut drained = self.drained.lock().await;
        let channel = self.channel().await?;
        // A confirm means every queue accepted the message: all of it is there to get.
        while let Some(got) = channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .map_err(|e| broker_error("basic.get", e))?
        {
            drained.push(got.delivery);
        }
        Ok(drained
            .iter()
            .filter(|d| d.routing_key.as_str() == destination)
            .map(received)
            .collect())
    }

    async fn teardown(&self) -> Result<()> {
        let channel = self.channel().await?;
        channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| broker_error("deleting the queue", e))?;
        // Usually gone with its binding already (auto-delete).
        let _ = channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.link.lock().await.0.close(200, "done".into()).await;
        Ok(())
    }
}
