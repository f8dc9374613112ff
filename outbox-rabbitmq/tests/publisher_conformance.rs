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

use async_trait::async_trait;
use outbox_core::{Error, ErrorKind, Publisher, Result};
use outbox_rabbitmq::lapin::message::Delivery;
use outbox_rabbitmq::lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use outbox_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use outbox_rabbitmq::lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_rabbitmq::{RabbitPublisher, RabbitPublisherConfig, Routing};
use outbox_testkit::{PublisherFeatures, PublisherHarness, PublisherNamespace, Received};

struct RabbitHarness {
    url: String,
}

async fn harness() -> Option<RabbitHarness> {
    let url = common::amqp_url()?;
    Some(RabbitHarness { url })
}

outbox_testkit::publisher_suite!(harness);

fn broker_error(doing: &str, err: outbox_rabbitmq::lapin::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("test broker: {doing}")).with_source(err)
}

#[async_trait]
impl PublisherHarness for RabbitHarness {
    fn features(&self) -> PublisherFeatures {
        let mut features = PublisherFeatures::default();
        // `mandatory` publishes come back as basic.return.
        features.unroutable_is_permanent = true;
        // RabbitMQ keeps no dedup window: consumers deduplicate on message-id.
        features.dedup_window = false;
        features
    }

    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>> {
        let connection = Connection::connect(
            &self.url,
            ConnectionProperties::default().with_connection_name(common::unique("conf").into()),
        )
        .await
        .map_err(|e| broker_error("connecting", e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| broker_error("opening a channel", e))?;
        let exchange = common::unique("conf-ex");
        let queue = common::unique("conf-q");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    auto_delete: true,
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
        Ok(Box::new(RabbitNamespace {
            url: self.url.clone(),
            exchange,
            queue,
            connection,
            channel,
            drained: tokio::sync::Mutex::new(Vec::new()),
        }))
    }
}

struct RabbitNamespace {
    url: String,
    exchange: String,
    queue: String,
    connection: Connection,
    channel: Channel,
    /// Everything taken from the queue so far, in queue order.
    drained: tokio::sync::Mutex<Vec<Delivery>>,
}

impl std::fmt::Debug for RabbitNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitNamespace")
            .field("exchange", &self.exchange)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
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
        // A confirm means every queue accepted the message: all of it is there to get.
        while let Some(got) = self
            .channel
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
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| broker_error("deleting the queue", e))?;
        // Usually gone with its binding already (auto-delete).
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.connection.close(200, "done".into()).await;
        Ok(())
    }
}
