//! Shared by the RabbitMQ tests: the gate on `OUTBOX_AMQP_URL`, per-test topology,
//! reading messages back, messages to publish, and a TCP proxy that can cut the
//! publisher off from the broker.
#![allow(dead_code, unreachable_pub)]

pub mod private;
pub mod proxy;

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use outbox_core::backend::MessageParts;
use outbox_core::{Headers, Message, MessageId, PublishOutcome};
use outbox_rabbitmq::lapin::message::Delivery;
use outbox_rabbitmq::lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use outbox_rabbitmq::lapin::types::{AMQPValue, FieldTable, ShortString};
use outbox_rabbitmq::lapin::uri::AMQPUri;
use outbox_rabbitmq::lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_rabbitmq::{RabbitPublisherConfig, PARTITION_KEY_HEADER};

/// The broker's URL, or `None` (with a visible skip) when `OUTBOX_AMQP_URL` is unset.
pub fn amqp_url() -> Option<String> {
    outbox_testkit::service_url("OUTBOX_AMQP_URL", "RabbitMQ publisher tests")
}

/// `service_test!` for the tests that need the broker, on a runtime of two workers:
/// ignored, with this reason, when `OUTBOX_AMQP_URL` was not set at build time. Each
/// test awaits its fixture first (a future of `Option`: `None` skips it), for example
/// [`broker`].
#[allow(unused_macros)]
macro_rules! rabbit_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_AMQP_URL was not set at build time (see the build warning)";
            flavor = multi_thread(2);
            $($tests)*
        }
    };
}

/// [`amqp_url`], as a `rabbit_test!` fixture.
pub async fn service_url() -> Option<String> {
    amqp_url()
}

/// A `rabbit_test!` fixture: the broker's URL and a [`Broker`] connected to it.
pub async fn broker() -> Option<(String, Broker)> {
    let url = amqp_url()?;
    let broker = Broker::connect(&url).await;
    Some((url, broker))
}

/// A name no other test or run uses.
pub fn unique(prefix: &str) -> String {
    format!("outbox-test-{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// Queues left by a crashed run disappear by themselves after this long unused.
const QUEUE_EXPIRES_MS: i64 = 120_000;

/// A connection of the test's own to declare topology and read messages back.
pub struct Broker {
    pub url: String,
    connection: Connection,
    channel: Channel,
    queues: Vec<String>,
    exchanges: Vec<String>,
}

impl Broker {
    pub async fn connect(url: &str) -> Broker {
        let connection = Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name(unique("admin").into()),
        )
        .await
        .expect("test connection to RabbitMQ");
        let channel = connection.create_channel().await.expect("channel");
        Broker {
            url: url.to_owned(),
            connection,
            channel,
            queues: Vec::new(),
            exchanges: Vec::new(),
        }
    }

    /// A publisher config for this broker, named uniquely.
    pub fn config(&self) -> RabbitPublisherConfig {
        RabbitPublisherConfig::new(self.url.clone()).with_connection_name(unique("publisher"))
    }

    /// A topic exchange, deleted when the broker is torn down (and, left behind by a
    /// crash, once its last queue expired).
    pub async fn topic_exchange(&mut self) -> String {
        let name = unique("ex");
        let options = ExchangeDeclareOptions {
            auto_delete: true,
            ..ExchangeDeclareOptions::default()
        };
        self.channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        self.exchanges.push(name.clone());
        name
    }

    /// A queue named `name`, durable or not, expiring when unused after a crash.
    pub async fn queue_named(&mut self, name: &str, durable: bool) {
        let mut arguments = FieldTable::default();
        arguments.insert("x-expires".into(), AMQPValue::LongLongInt(QUEUE_EXPIRES_MS));
        let options = QueueDeclareOptions {
            durable,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(name.into(), options, arguments)
            .await
            .expect("declare queue");
        self.queues.push(name.to_owned());
    }

    /// A fresh queue bound to `exchange` with `pattern`.
    pub async fn bound_queue(&mut self, exchange: &str, pattern: &str, durable: bool) -> String {
        let name = unique("q");
        self.queue_named(&name, durable).await;
        self.channel
            .queue_bind(
                name.as_str().into(),
                exchange.into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
        name
    }

    /// Messages waiting in `queue`.
    pub async fn depth(&self, queue: &str) -> u32 {
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await
            .expect("passive declare")
            .message_count()
    }

    /// Take every message of `queue`, waiting until there are `expected`; then check
    /// that no more arrive than expected.
    pub async fn take(&self, queue: &str, expected: usize) -> Vec<Delivery> {
        let taken = std::sync::Mutex::new(Vec::new());
        outbox_testkit::wait::wait_until(&format!("{expected} messages in {queue}"), || {
            let taken = &taken;
            async move {
                while let Some(got) = self
                    .channel
                    .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                    .await
                    .expect("basic.get")
                {
                    taken.lock().unwrap().push(got.delivery);
                }
                taken.lock().unwrap().len() >= expected
            }
        })
        .await;
        let taken = taken.into_inner().unwrap();
        assert_eq!(
            taken.len(),
            expected,
            "more messages than expected in {queue}"
        );
        taken
    }

    /// Delete what the test declared.
    pub async fn teardown(self) {
        for queue in &self.queues {
            let _ = self
                .channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for exchange in &self.exchanges {
            let _ = self
                .channel
                .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// A stored message as a relay would claim it.
pub fn message(destination: &str, payload: impl Into<Vec<u8>>) -> Message {
    Message::from(MessageParts {
        id: MessageId::new(),
        destination: destination.into(),
        partition_key: None,
        payload: payload.into(),
        content_type: None,
        headers: Headers::new(),
        created_at: SystemTime::now(),
        attempts: 1,
        last_error: None,
    })
}

pub fn messages(destination: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| message(destination, format!("message {i}").into_bytes()))
        .collect()
}

/// A property as text.
pub fn text(value: &Option<ShortString>) -> Option<&str> {
    value.as_ref().map(ShortString::as_str)
}

/// The `message-id` of a delivery.
pub fn message_id(delivery: &Delivery) -> MessageId {
    let id = text(delivery.properties.message_id()).expect("message-id set");
    MessageId::from_str(id).expect("message-id is the outbox id")
}

/// The headers of a delivery, all long strings, the partition key apart.
pub fn headers(delivery: &Delivery) -> (Headers, Option<String>) {
    let mut headers = Headers::new();
    let mut key = None;
    if let Some(table) = delivery.properties.headers() {
        for (name, value) in table {
            let AMQPValue::LongString(value) = value else {
                panic!("header {name} is not a long string: {value:?}");
            };
            let value = String::from_utf8(value.as_bytes().to_vec()).expect("utf-8 header");
            if name.as_str() == PARTITION_KEY_HEADER {
                key = Some(value);
            } else {
                headers.insert(name.as_str(), value);
            }
        }
    }
    (headers, key)
}

pub fn all_published(outcomes: &[PublishOutcome]) -> bool {
    outcomes.iter().all(|o| *o == PublishOutcome::Published)
}

/// `url` pointing at `127.0.0.1:port` instead, same user and vhost.
pub fn via_port(url: &str, port: u16) -> String {
    let uri = AMQPUri::from_str(url).expect("AMQP URI");
    let vhost = uri.vhost.replace('%', "%25").replace('/', "%2f");
    format!(
        "amqp://{}:{}@127.0.0.1:{port}/{vhost}",
        uri.authority.userinfo.username, uri.authority.userinfo.password
    )
}

/// `host:port` of the broker at `url`.
pub fn address(url: &str) -> String {
    let uri = AMQPUri::from_str(url).expect("AMQP URI");
    format!("{}:{}", uri.authority.host, uri.authority.port)
}

/// A generous bound on one publish call under `config`'s timeouts.
pub fn bound(config: &RabbitPublisherConfig) -> Duration {
    config.connect_timeout() * 2 + config.publish_timeout() + Duration::from_secs(2)
}
