//! The relays with a real broker, against that broker's own client, in one run.
//!
//! ```text
//! eval "$(scripts/services.sh)"
//! cargo bench -p outbox-bench --bench broker_bench              # about nine minutes
//! cargo bench -p outbox-bench --bench broker_bench -- --quick   # about a minute (or OUTBOX_BENCH_QUICK=1)
//! OUTBOX_BENCH_ONLY=wal cargo bench -p outbox-bench --bench broker_bench   # one to two minutes
//! ```
//!
//! For NATS JetStream (a file-stored stream) and RabbitMQ (a durable queue, persistent
//! messages, publisher confirms):
//!
//! 1. **Throughput.** The same messages (an order event of about 120 bytes, a content
//!    type, the id as the broker's dedup id) are published (a) by the broker's raw
//!    client in a loop keeping as many messages unacknowledged as one relay's batch
//!    keeps in flight, and (b) by relays draining a PostgreSQL outbox pre-loaded
//!    with them (loading not timed), batch [`BATCHES`], through `NatsPublisher` /
//!    `RabbitPublisher`: one relay at each pipeline depth of [`DEPTHS`] (1 =
//!    pipelining off), two relays at the default depth, and one relay at the default
//!    depth with held-lock claims (`ClaimMode::HeldLock`). The ratio is relay msgs/s
//!    over raw msgs/s; each figure is the median of the runs, raw and relay taking
//!    turns.
//! 2. **Log-tailing relay** (`outbox-postgres-wal`), in the same rounds: one `WalRelay`
//!    streams the same messages, enqueued with `WalOutbox::enqueue` 1,000 per
//!    transaction (not timed), from a fresh replication slot into the same publisher,
//!    batch [`BATCHES`], with [`WAL_CONCURRENCY`] calls in flight and with one; timed
//!    until the publisher has accepted every message. It runs
//!    on a private PostgreSQL cluster with `wal_level = logical` (and `fsync = on`, as
//!    the shared server), started by the bench; without PostgreSQL server binaries it
//!    is skipped. Ratios to the library's publisher alone and to the raw client, and
//!    CPU per message of this process and of every `postgres` process.
//! 3. **Latency.** One open-loop producer commits [`RATE`] transactions per second, one
//!    message each; a relay woken by `LISTEN/NOTIFY` publishes them. Latency is from
//!    the producer's `COMMIT` returning to the publish call returning with the broker's
//!    acks (the last ack of the message's batch), both on one monotonic clock.
//!
//! Two more figures split the relay's time: the library's publisher alone (batch-sized
//! calls one at a time, no database), and relays with a no-op publisher (PostgreSQL alone).
//!
//! `OUTBOX_BENCH_ONLY=wal` runs only the raw client, the publisher alone and the
//! log-tailing relay, taking turns (no polling relays, no latency).
//!
//! `OUTBOX_BENCH_PROFILE=nats:publisher:20000:1000` runs one workload alone, for
//! counting instructions per message with callgrind (see [`profile`]).
//!
//! Reads `OUTBOX_PG_URL`, `OUTBOX_NATS_URL`, `OUTBOX_AMQP_URL`. Everything it creates
//! (an `obx_bench_broker_*` schema, stream, exchange and queue, the private cluster) is
//! removed at the end. It reports figures and asserts none.

use std::collections::{HashMap, VecDeque};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::{stream, StreamExt};
use outbox_bench::{
    median, ms, noop_publisher, order_message, percentile, stored, Res, ORDER_DESTINATION,
};
use outbox_core::{
    relay::DEFAULT_PIPELINE_DEPTH, ClaimMode, Message, MessageId, NewMessage, OutboxStore,
    PublishOutcome, Publisher, Relay, RelayConfig,
};
use outbox_nats::async_nats::jetstream::{
    self, context::PublishAckFuture, message::PublishMessage, stream::StorageType,
};
use outbox_nats::async_nats::HeaderMap;
use outbox_nats::{NatsPublisher, NatsPublisherConfig, CONTENT_TYPE_HEADER, MESSAGE_ID_HEADER};
use outbox_postgres::{spawn_listener, Notify, PgOutbox, PgOutboxConfig};
use outbox_postgres_wal::{
    ReplicationTarget, WalOutbox, WalOutboxConfig, WalRelay, WalRelayConfig,
};
use outbox_rabbitmq::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use outbox_rabbitmq::lapin::types::FieldTable;
use outbox_rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind, PublisherConfirm,
};
use outbox_rabbitmq::{RabbitPublisher, RabbitPublisherConfig, Routing};
use outbox_testkit::cpu::{self, Server};
use outbox_testkit::postgres::cluster::Cluster;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio_util::sync::CancellationToken;

/// Pipeline depths one relay is measured at (1 = pipelining off).
const DEPTHS: [usize; 3] = [1, 2, 4];

/// The relays' claim and publish batches; the raw loop keeps as many unacknowledged.
const BATCHES: [usize; 2] = [100, 1_000];
/// The log-tailing relay's publish calls in flight (its default), beside one.
const WAL_CONCURRENCY: usize = 4;
/// The latency scenario's offered rate, transactions (and messages) per second.
const RATE: u32 = 1_000;
/// Transactions in flight at most in the latency scenario: the producer's pool.
const PRODUCERS: u32 = 16;
/// Latency samples from the first this-long are not counted.
const WARM_UP: Duration = Duration::from_millis(500);
/// The destination every message goes to.
const DESTINATION: &str = ORDER_DESTINATION;
/// How long a drain or the latency tail may take before the bench gives up.
const GIVE_UP: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
struct Mode {
    quick: bool,
    /// `OUTBOX_BENCH_ONLY=wal`: the raw client, the publisher alone and the
    /// log-tailing relay only.
    only_wal: bool,
}

impl Mode {
    fn pick<T>(self, full: T, quick: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

fn var(name: &str) -> Res<String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run `eval \"$(scripts/services.sh)\"` first").into()
    })
}

fn unique(prefix: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{prefix}_{secs}_{:08x}", fastrand::u32(..))
}

/// `n` order events of about 120 bytes, as the PostgreSQL bench sends.
fn orders(n: u64) -> Res<Vec<NewMessage>> {
    Ok((0..n)
        .map(order_message)
        .collect::<outbox_core::Result<_>>()?)
}

/// One broker under test: its publisher for relays and its raw client loop.
#[async_trait]
trait Broker: Send + Sync {
    fn name(&self) -> &'static str;
    /// The broker's processes, for its CPU per message.
    fn server(&self) -> Server;
    /// A publisher as one relay process would hold.
    async fn publisher(&self) -> Res<Arc<dyn Publisher>>;
    /// Publish `messages` with the raw client, `window` unacknowledged at most;
    /// returns the elapsed time once every ack arrived (`None`: no raw client).
    async fn raw(&self, messages: &[NewMessage], window: usize) -> Res<Option<Duration>>;
    /// Empty what the broker stored so far (between runs).
    async fn clear(&self) -> Res<()>;
    /// Remove what the bench created.
    async fn teardown(&self) -> Res<()>;
}

/// The control: relays publishing to nothing, what PostgreSQL alone allows.
struct NoBroker;

#[async_trait]
impl Broker for NoBroker {
    fn name(&self) -> &'static str {
        "none (no-op)"
    }

    fn server(&self) -> Server {
        Server::None
    }

    async fn publisher(&self) -> Res<Arc<dyn Publisher>> {
        Ok(noop_publisher())
    }

    async fn raw(&self, _: &[NewMessage], _: usize) -> Res<Option<Duration>> {
        Ok(None)
    }

    async fn clear(&self) -> Res<()> {
        Ok(())
    }

    async fn teardown(&self) -> Res<()> {
        Ok(())
    }
}

struct Nats {
    url: String,
    js: jetstream::Context,
    stream: String,
}

impl Nats {
    async fn setup(url: &str) -> Res<Nats> {
        let client = outbox_nats::async_nats::connect(url).await?;
        let js = jetstream::new(client);
        let stream = unique("obx_bench_broker");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            storage: StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
        Ok(Nats {
            url: url.to_owned(),
            js,
            stream,
        })
    }
}

#[async_trait]
impl Broker for Nats {
    fn name(&self) -> &'static str {
        "NATS JetStream"
    }

    fn server(&self) -> Server {
        Server::Nats
    }

    async fn publisher(&self) -> Res<Arc<dyn Publisher>> {
        let config = NatsPublisherConfig::new(&self.url).with_subject_prefix(&self.stream);
        Ok(Arc::new(NatsPublisher::connect(config).await?))
    }

    async fn raw(&self, messages: &[NewMessage], window: usize) -> Res<Option<Duration>> {
        let subject = format!("{}.{DESTINATION}", self.stream);
        let start = Instant::now();
        let publishes: Vec<_> = messages
            .iter()
            .map(|m| nats_publish(&self.js, subject.clone(), m))
            .collect();
        let mut acks = stream::iter(publishes).buffer_unordered(window);
        while let Some(ack) = acks.next().await {
            ack?;
        }
        Ok(Some(start.elapsed()))
    }

    async fn clear(&self) -> Res<()> {
        self.js.get_stream(&self.stream).await?.purge().await?;
        Ok(())
    }

    async fn teardown(&self) -> Res<()> {
        self.js.delete_stream(&self.stream).await?;
        Ok(())
    }
}

/// One raw JetStream publish with the message id as `Nats-Msg-Id`, awaiting its ack.
async fn nats_publish(js: &jetstream::Context, subject: String, m: &NewMessage) -> Res<()> {
    let mut headers = HeaderMap::new();
    headers.insert(MESSAGE_ID_HEADER, m.id().to_string().as_str());
    headers.insert(CONTENT_TYPE_HEADER, "application/json");
    let publish = PublishMessage::build()
        .payload(bytes::Bytes::copy_from_slice(m.payload()))
        .headers(headers);
    let ack: PublishAckFuture = js.send_publish(subject, publish).await?;
    ack.await?;
    Ok(())
}

struct Rabbit {
    url: String,
    connection: Connection,
    channel: Channel,
    exchange: String,
    queue: String,
}

impl Rabbit {
    async fn setup(url: &str) -> Res<Rabbit> {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let exchange = unique("obx-bench-broker");
        let queue = exchange.clone();
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Rabbit {
            url: url.to_owned(),
            connection,
            channel,
            exchange,
            queue,
        })
    }
}

#[async_trait]
impl Broker for Rabbit {
    fn name(&self) -> &'static str {
        "RabbitMQ"
    }

    fn server(&self) -> Server {
        Server::RabbitMq
    }

    async fn publisher(&self) -> Res<Arc<dyn Publisher>> {
        let config = RabbitPublisherConfig::new(self.url.clone())
            .with_routing(Routing::exchange(&self.exchange));
        Ok(Arc::new(RabbitPublisher::connect(config).await?))
    }

    async fn raw(&self, messages: &[NewMessage], window: usize) -> Res<Option<Duration>> {
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let start = Instant::now();
        let mut pending = VecDeque::with_capacity(window);
        for m in messages {
            if pending.len() >= window {
                if let Some(confirm) = pending.pop_front() {
                    settle(confirm).await?;
                }
            }
            let properties = BasicProperties::default()
                .with_message_id(m.id().to_string().into())
                .with_delivery_mode(2)
                .with_content_type("application/json".into());
            let confirm = self
                .channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    DESTINATION.into(),
                    options,
                    m.payload(),
                    properties,
                )
                .await?;
            pending.push_back(confirm);
        }
        for confirm in pending {
            settle(confirm).await?;
        }
        Ok(Some(start.elapsed()))
    }

    async fn clear(&self) -> Res<()> {
        self.channel
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    async fn teardown(&self) -> Res<()> {
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        self.channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        self.connection.close(200, "done".into()).await?;
        Ok(())
    }
}

async fn settle(confirm: PublisherConfirm) -> Res<()> {
    let confirmation = confirm.await?;
    if confirmation.is_ack() && confirmation.take_message().is_none() {
        Ok(())
    } else {
        Err("RabbitMQ did not confirm a raw publish".into())
    }
}

/// The PostgreSQL side: a schema of the bench's own, an admin pool, and pools of their
/// own for relays and producers (so a producer's backlog never queues a relay's claim
/// behind it).
struct Pg {
    url: String,
    admin: PgPool,
    schema: String,
}

impl Pg {
    async fn setup(url: &str) -> Res<Pg> {
        Ok(Pg {
            url: url.to_owned(),
            admin: Pg::connect(url, 4).await?,
            schema: unique("obx_bench_broker"),
        })
    }

    async fn connect(url: &str, size: u32) -> Res<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(size)
            .connect(url)
            .await?)
    }

    async fn pool(&self, size: u32) -> Res<PgPool> {
        Pg::connect(&self.url, size).await
    }

    /// An installed outbox on the admin pool.
    async fn outbox(&self, table: &str, notify: Notify) -> Res<PgOutbox> {
        let config = PgOutboxConfig::default()
            .with_schema(&self.schema)
            .with_table(table)
            .with_notify(notify);
        let outbox = PgOutbox::new(self.admin.clone(), config)?;
        outbox.install().await?;
        Ok(outbox)
    }

    async fn teardown(&self) -> Res<()> {
        sqlx::query(&format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema
        ))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }
}

/// Enqueue `messages`, 1,000 per transaction.
async fn preload(outbox: &PgOutbox, messages: &[NewMessage]) -> Res<()> {
    for chunk in messages.chunks(1_000) {
        let mut tx = outbox.pool().begin().await?;
        outbox.enqueue(&mut tx, chunk).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Publish `messages` through one publisher in `batch`-sized calls, one call at a time,
/// as a relay would but with no database: the publisher's share of a relay's time.
/// Returns the time and the CPU spent meanwhile.
async fn publisher_alone(
    broker: &dyn Broker,
    batch: usize,
    messages: &[NewMessage],
) -> Res<(Duration, Cpu)> {
    let publisher = broker.publisher().await?;
    let claimed: Vec<Message> = messages.iter().map(stored).collect();
    let meter = Meter::start(broker);
    let start = Instant::now();
    for chunk in claimed.chunks(batch) {
        let outcomes = publisher.publish(chunk).await?;
        if outcomes.iter().any(|o| *o != PublishOutcome::Published) {
            return Err("the publisher did not publish a whole batch".into());
        }
    }
    let took = start.elapsed();
    Ok((took, meter.per(messages.len())))
}

/// One polling-relay run of the throughput table: how many relays, at which pipeline
/// depth, claiming how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RelayRun {
    relays: usize,
    depth: usize,
    mode: ClaimMode,
}

/// Pre-load `messages` and drain them with `run.relays` relays, each with its own
/// publisher; returns the time from the relays' start to the last dispatch.
async fn relay_drain(
    pg: &Pg,
    outbox: &PgOutbox,
    broker: &dyn Broker,
    run: RelayRun,
    batch: usize,
    messages: &[NewMessage],
) -> Res<(Duration, Cpu)> {
    let RelayRun {
        relays,
        depth,
        mode,
    } = run;
    preload(outbox, messages).await?;
    // A pipelined relay may have a claim and a settle on the wire for each batch; held
    // batches each keep a connection of the held pool, plus one for the next claim.
    let pool = pg.pool(u32::try_from(relays * depth)? + 1).await?;
    let config = outbox
        .config()
        .clone()
        .with_claim_mode(mode)
        .with_held_connections(u32::try_from(relays * (depth + 1))?);
    let store: Arc<dyn OutboxStore> = Arc::new(PgOutbox::new(pool.clone(), config)?);
    let mut running = Vec::new();
    for i in 0..relays {
        let config = RelayConfig::default()
            .with_name(format!("bench-{i}"))
            .with_batch_size(batch)
            .with_publish_batch_size(batch)
            .with_publish_concurrency(1)
            .with_pipeline_depth(depth);
        running.push(Relay::new(
            store.clone(),
            broker.publisher().await?,
            config,
        )?);
    }
    let n = u64::try_from(messages.len())?;
    let meter = Meter::start(broker);
    let start = Instant::now();
    let handles: Vec<_> = running.iter().map(Relay::spawn).collect();
    let dispatched = || running.iter().map(|r| r.report().dispatched).sum::<u64>();
    while dispatched() < n {
        if start.elapsed() > GIVE_UP {
            return Err(format!("relays dispatched {} of {n} in {GIVE_UP:?}", dispatched()).into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    let spent = meter.per(messages.len());
    for handle in handles {
        let report = handle.shutdown().await?;
        if report.retried + report.dead_lettered + report.leases_lost > 0 {
            return Err(format!("a relay did more than dispatch: {report:?}").into());
        }
    }
    pool.close().await;
    Ok((took, spent))
}

/// The log-tailing relay's PostgreSQL: a private cluster with `wal_level = logical`,
/// one outbox (its slot created afresh for every drain).
struct Wal {
    url: String,
    pool: PgPool,
    outbox: WalOutbox,
}

/// The log-tailing outbox's slot, publication, prefix and dead-letter schema.
const WAL_NAME: &str = "obx_bench_wal";

impl Wal {
    async fn setup(cluster: &Cluster) -> Res<Wal> {
        let url = cluster.url();
        // The relay's lock holds one connection; loading and slot checks use others.
        let pool = Pg::connect(&url, 4).await?;
        let config = WalOutboxConfig::default()
            .with_slot(WAL_NAME)
            .with_publication(WAL_NAME)
            .with_prefix(WAL_NAME)
            .with_dead_letters(PgOutboxConfig::default().with_schema(WAL_NAME));
        let outbox = WalOutbox::new(pool.clone(), config)?;
        Ok(Wal { url, pool, outbox })
    }

    async fn version(&self) -> Res<String> {
        Ok(sqlx::query_scalar("SHOW server_version")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Drop the slot once the stopped relay's walsender let go of it: the next drain
    /// starts a fresh one.
    async fn drop_slot(&self) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.outbox.slot_status().await?.is_some_and(|s| s.active) {
            if Instant::now() > deadline {
                return Err("the replication slot stayed active after the relay stopped".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(self.outbox.config().slot())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Counts the messages the inner publisher accepted (how a drain knows it is done) and
/// notes when the first batch arrived.
#[derive(Debug)]
struct Seen {
    inner: Arc<dyn Publisher>,
    published: AtomicU64,
    first: OnceLock<Instant>,
}

#[async_trait]
impl Publisher for Seen {
    async fn publish(&self, batch: &[Message]) -> outbox_core::Result<Vec<PublishOutcome>> {
        self.first.get_or_init(Instant::now);
        let outcomes = self.inner.publish(batch).await?;
        let ok = outcomes
            .iter()
            .filter(|o| **o == PublishOutcome::Published)
            .count();
        self.published
            .fetch_add(u64::try_from(ok).unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok(outcomes)
    }
}

/// Enqueue `messages` into the log-tailing outbox (1,000 per transaction, behind a
/// fresh slot) and stream them with one `WalRelay` into the broker's publisher; returns
/// the time from the relay's start until the publisher accepted every message, the CPU
/// spent meanwhile, and the time from the relay's start to its first publish call (its
/// lock, slot checks and replication session: a fixed cost in the total).
async fn wal_drain(
    wal: &Wal,
    broker: &dyn Broker,
    batch: usize,
    concurrency: usize,
    messages: &[NewMessage],
) -> Res<(Duration, Cpu, Duration)> {
    // A slot streams only what is committed after it was created: install first.
    wal.outbox.install().await?;
    for chunk in messages.chunks(1_000) {
        let mut tx = wal.pool.begin().await?;
        wal.outbox.enqueue(&mut tx, chunk).await?;
        tx.commit().await?;
    }
    let seen = Arc::new(Seen {
        inner: broker.publisher().await?,
        published: AtomicU64::new(0),
        first: OnceLock::new(),
    });
    let relay = WalRelay::new(
        wal.outbox.clone(),
        ReplicationTarget::from_url(&wal.url)?,
        seen.clone(),
        WalRelayConfig::default()
            .with_batch_size(batch)
            .with_publish_concurrency(concurrency),
    )?;
    let n = u64::try_from(messages.len())?;
    let stop = CancellationToken::new();
    let meter = Meter::start(broker);
    let start = Instant::now();
    let mut task = tokio::spawn(relay.run(stop.clone()));
    // On an early return the relay is told to stop, too.
    let _stop_on_drop = stop.clone().drop_guard();
    while seen.published.load(Ordering::Relaxed) < n {
        if task.is_finished() {
            let ended = (&mut task).await?;
            return Err(format!("the log-tailing relay stopped early: {ended:?}").into());
        }
        if start.elapsed() > GIVE_UP {
            let published = seen.published.load(Ordering::Relaxed);
            return Err(format!(
                "the log-tailing relay published {published} of {n} in {GIVE_UP:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    let spent = meter.per(messages.len());
    let startup = seen
        .first
        .get()
        .map_or(took, |first| first.saturating_duration_since(start));
    stop.cancel();
    let report = task.await??;
    if report.dead_lettered > 0 || report.published != n {
        return Err(format!("the log-tailing relay did more than publish: {report:?}").into());
    }
    wal.drop_slot().await?;
    Ok((took, spent, startup))
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

/// CPU per message, µs: this process, every PostgreSQL process, the broker's.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    client: f64,
    pg: f64,
    broker: f64,
}

/// The CPU counters of this process, PostgreSQL and one broker, from one moment.
struct Meter {
    pg: cpu::Sample,
    broker: cpu::Sample,
}

impl Meter {
    fn start(broker: &dyn Broker) -> Self {
        Meter {
            pg: cpu::sample(Server::Postgres),
            broker: cpu::sample(broker.server()),
        }
    }

    /// What was spent since the start, per message of `n`.
    fn per(self, n: usize) -> Cpu {
        let n = n as u64;
        let (client, pg) = cpu::since(self.pg).per(n);
        let (_, broker) = cpu::since(self.broker).per(n);
        Cpu { client, pg, broker }
    }
}

/// Medians of one system's runs: msgs/s and CPU per message.
#[derive(Debug, Default)]
struct Runs {
    rates: Vec<f64>,
    cpu: Vec<Cpu>,
}

impl Runs {
    fn push(&mut self, n: usize, took: Duration, cpu: Cpu) {
        self.rates.push(rate(n, took));
        self.cpu.push(cpu);
    }

    /// msgs/s and each CPU figure, each the median of the runs.
    fn medians(self) -> (f64, Cpu) {
        let of = |f: fn(&Cpu) -> f64| median(&self.cpu.iter().map(f).collect::<Vec<_>>());
        let cpu = Cpu {
            client: of(|c| c.client),
            pg: of(|c| c.pg),
            broker: of(|c| c.broker),
        };
        (median(&self.rates), cpu)
    }
}

fn cell(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "-".to_owned()
    }
}

async fn throughput(
    mode: Mode,
    pg: &Pg,
    wal: Option<&Wal>,
    brokers: &[Box<dyn Broker>],
) -> Res<()> {
    let n: u64 = mode.pick(20_000, 5_000);
    let runs = mode.pick(3, 1);
    // Each relay run: one relay at each depth, two relays at the default depth, and one
    // relay with held-lock claims at the default depth.
    let lease = |relays, depth| RelayRun {
        relays,
        depth,
        mode: ClaimMode::Lease,
    };
    let runs_of: Vec<RelayRun> = if mode.only_wal {
        Vec::new()
    } else {
        DEPTHS
            .iter()
            .map(|&depth| lease(1, depth))
            .chain([
                lease(2, DEFAULT_PIPELINE_DEPTH),
                RelayRun {
                    mode: ClaimMode::HeldLock,
                    ..lease(1, DEFAULT_PIPELINE_DEPTH)
                },
            ])
            .collect()
    };
    if !mode.only_wal {
        println!(
            "\n## 1. Throughput: {n} messages, raw client loop (as many unacknowledged as the \
             batch) vs relays draining a pre-loaded PostgreSQL outbox; median of {runs} \
             run(s), taking turns\n"
        );
        print!(
            "| {:<15} | {:>5} | {:>10} | {:>10} |",
            "broker", "batch", "raw msg/s", "publisher"
        );
        for depth in DEPTHS {
            print!(" {:>10} | {:>5} |", format!("x1 depth {depth}"), "ratio");
        }
        print!(" {:>10} | {:>5} |", "x2 default", "ratio");
        println!(" {:>10} | {:>5} |", "x1 held", "ratio");
        print!("|{:-<17}|{:->7}|{:->12}|{:->12}|", "", "", "", "");
        for _ in 0..DEPTHS.len() + 2 {
            print!("{:->12}|{:->7}|", "", "");
        }
        println!();
    }
    let outbox = pg.outbox("drain", Notify::Off).await?;
    let messages = || orders(n);
    // The CPU table and the log-tailing table, printed after the polling relays' table.
    let (mut cpu_rows, mut wal_rows) = (Vec::new(), Vec::new());
    for broker in brokers {
        for batch in BATCHES {
            let (mut raw, mut alone, mut tailed) =
                (Runs::default(), Runs::default(), Runs::default());
            let mut tailed_one = Runs::default();
            let mut startups = Vec::new();
            let mut relayed: Vec<Runs> = runs_of.iter().map(|_| Runs::default()).collect();
            for _ in 0..runs {
                let sent = messages()?;
                // With no broker there is no raw client, and the publisher alone is free.
                let meter = Meter::start(&**broker);
                if let Some(took) = broker.raw(&sent, batch).await? {
                    raw.push(sent.len(), took, meter.per(sent.len()));
                    broker.clear().await?;
                    let sent = messages()?;
                    let (took, spent) = publisher_alone(&**broker, batch, &sent).await?;
                    alone.push(sent.len(), took, spent);
                    broker.clear().await?;
                }
                for (&run, runs) in runs_of.iter().zip(&mut relayed) {
                    let sent = messages()?;
                    let (took, spent) =
                        relay_drain(pg, &outbox, &**broker, run, batch, &sent).await?;
                    runs.push(sent.len(), took, spent);
                    broker.clear().await?;
                }
                if let Some(wal) = wal {
                    let sent = messages()?;
                    let (took, spent, startup) =
                        wal_drain(wal, &**broker, batch, WAL_CONCURRENCY, &sent).await?;
                    tailed.push(sent.len(), took, spent);
                    startups.push(ms(startup));
                    broker.clear().await?;
                    let sent = messages()?;
                    let (took, spent, _) = wal_drain(wal, &**broker, batch, 1, &sent).await?;
                    tailed_one.push(sent.len(), took, spent);
                    broker.clear().await?;
                }
            }
            let (raw, raw_cpu) = raw.medians();
            let (alone, alone_cpu) = alone.medians();
            if !mode.only_wal {
                print!(
                    "| {:<15} | {batch:>5} | {:>10} | {:>10} |",
                    broker.name(),
                    cell(raw, 0),
                    cell(alone, 0),
                );
                let mut default_cpu = Cpu::default();
                for (&run, runs) in runs_of.iter().zip(relayed) {
                    let (relayed, cpu) = runs.medians();
                    if run == lease(1, DEFAULT_PIPELINE_DEPTH) {
                        default_cpu = cpu;
                    }
                    print!(" {relayed:>10.0} | {:>5} |", cell(relayed / raw, 2));
                }
                println!();
                cpu_rows.push(format!(
                    "| {:<15} | {batch:>5} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | \
                     {:>8} |",
                    broker.name(),
                    cell(raw_cpu.client, 2),
                    cell(raw_cpu.broker, 2),
                    cell(alone_cpu.client, 2),
                    cell(alone_cpu.broker, 2),
                    cell(default_cpu.client, 2),
                    cell(default_cpu.pg, 2),
                    cell(default_cpu.broker, 2),
                ));
            }
            let (tailed, tailed_cpu) = tailed.medians();
            let (tailed_one, _) = tailed_one.medians();
            wal_rows.push(format!(
                "| {:<15} | {batch:>5} | {:>10} | {:>10} | {:>10} | {:>11} | {:>6} | {:>6} | \
                 {:>8} | {:>8} | {:>8} | {:>11} | {:>9} |",
                broker.name(),
                cell(raw, 0),
                cell(alone, 0),
                cell(tailed_one, 0),
                cell(tailed, 0),
                cell(tailed / alone, 2),
                cell(tailed / raw, 2),
                cell(median(&startups), 1),
                cell(alone_cpu.client, 2),
                cell(tailed_cpu.client, 2),
                cell(tailed_cpu.pg, 2),
                cell(tailed_cpu.broker, 2),
            ));
        }
    }
    if !mode.only_wal {
        println!(
            "\npublisher = the library's publisher alone, batch-sized calls one at a time, no \
             database; x1 depth d = one relay with pipeline_depth d (1 = pipelining off); x2 \
             default = two relays at the default depth ({DEFAULT_PIPELINE_DEPTH}); x1 held = one \
             relay at the default depth with held-lock claims; ratio = relay msgs/s / raw msgs/s (target for one relay: at least 0.80); the no-op rows are \
             relays with no broker: what PostgreSQL alone allows"
        );
        println!(
            "\nCPU per message, µs (the same runs, medians): bench = this process, broker = the \
             broker's processes (nats-server, RabbitMQ's Erlang VM), PG = every postgres \
             process; relay = one relay at the default depth ({DEFAULT_PIPELINE_DEPTH})\n"
        );
        println!(
            "| {:<15} | {:>5} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |",
            "broker", "batch", "raw", "broker", "pub.", "broker", "relay", "PG", "broker"
        );
        println!(
            "|{:-<17}|{:->7}|{:->10}|{:->10}|{:->10}|{:->10}|{:->10}|{:->10}|{:->10}|",
            "", "", "", "", "", "", "", "", ""
        );
        for row in cpu_rows {
            println!("{row}");
        }
    }
    let Some(wal) = wal else {
        println!("\n## 2. Log-tailing relay: SKIPPED (no private PostgreSQL cluster)");
        return Ok(());
    };
    println!(
        "\n## 2. Log-tailing relay (outbox-postgres-wal): {n} messages streamed from a fresh \
         slot by one WalRelay into the same publishers, PostgreSQL {} (private cluster, \
         wal_level = logical); median of {runs} run(s), taking turns with the raw client, \
         the publisher alone{}\n",
        wal.version().await?,
        if mode.only_wal {
            ""
        } else {
            " and the polling relays"
        }
    );
    println!(
        "| {:<15} | {:>5} | {:>10} | {:>10} | {:>10} | {:>11} | {:>6} | {:>6} | {:>8} | {:>8} | \
         {:>8} | {:>11} | {:>9} |",
        "broker",
        "batch",
        "raw msg/s",
        "publisher",
        "1 call",
        "log-tailing",
        "/ pub.",
        "/ raw",
        "start ms",
        "pub. µs",
        "relay µs",
        "relay PG µs",
        "broker µs"
    );
    println!(
        "|{:-<17}|{:->7}|{:->12}|{:->12}|{:->12}|{:->13}|{:->8}|{:->8}|{:->10}|{:->10}|{:->10}|{:->13}|{:->11}|",
        "", "", "", "", "", "", "", "", "", "", "", "", ""
    );
    for row in wal_rows {
        println!("{row}");
    }
    println!(
        "\nlog-tailing = one WalRelay (batch as shown, {WAL_CONCURRENCY} calls in flight, \
         the default) into the broker's publisher, msgs/s from its start until the publisher \
         accepted every message; 1 call = the same with publish_concurrency 1 (one call at \
         a time, as before the relay pipelined); / pub. = over the \
         library's publisher alone (target: at least 0.80); / raw = over the raw client; \
         start = from the relay's start to its first publish call (lock, slot checks, \
         replication session: a fixed cost inside the msgs/s, heavier in short runs); \
         CPU per message in µs: pub. = this process during the publisher alone, relay = \
         this process during the log-tailing drain (relay and publisher), relay PG = every \
         postgres process meanwhile (walsender and the relay's sessions), broker = the \
         broker's processes meanwhile; the no-op rows are the log-tailing relay with no \
         broker"
    );
    Ok(())
}

/// Notes when the broker acknowledged each message: when the inner publish returned.
#[derive(Debug)]
struct Acked {
    inner: Arc<dyn Publisher>,
    at: Mutex<HashMap<MessageId, Instant>>,
}

#[async_trait]
impl Publisher for Acked {
    async fn publish(&self, batch: &[Message]) -> outbox_core::Result<Vec<PublishOutcome>> {
        let outcomes = self.inner.publish(batch).await?;
        let now = Instant::now();
        let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
        for (m, outcome) in batch.iter().zip(&outcomes) {
            if *outcome == PublishOutcome::Published {
                at.entry(m.id).or_insert(now);
            }
        }
        Ok(outcomes)
    }
}

impl Acked {
    fn count(&self) -> usize {
        self.at.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

async fn latency(mode: Mode, pg: &Pg, brokers: &[Box<dyn Broker>]) -> Res<()> {
    let length = mode.pick(Duration::from_secs(10), Duration::from_secs(3));
    println!(
        "\n## 3. Commit-to-broker-ack latency: {RATE} msg/s offered for {length:?}, one \
         message per transaction, one relay woken by NOTIFY; first {WARM_UP:?} not counted\n"
    );
    println!(
        "| {:<15} | {:>11} | {:>7} | {:>7} | {:>7} | {:>7} |",
        "broker", "committed/s", "samples", "p50 ms", "p99 ms", "max ms"
    );
    println!(
        "|{:-<17}|{:->13}|{:->9}|{:->9}|{:->9}|{:->9}|",
        "", "", "", "", "", ""
    );
    for (i, broker) in brokers.iter().enumerate() {
        let outbox = pg.outbox(&format!("latency_{i}"), Notify::OnCommit).await?;
        let acked = Arc::new(Acked {
            inner: broker.publisher().await?,
            at: Mutex::default(),
        });
        let relay_pool = pg.pool(4).await?;
        let store: Arc<dyn OutboxStore> =
            Arc::new(PgOutbox::new(relay_pool.clone(), outbox.config().clone())?);
        let relay = Relay::new(
            store,
            acked.clone(),
            RelayConfig::default().with_name("latency"),
        )?;
        let channel = outbox
            .config()
            .notify_channel()
            .ok_or("the latency outbox has no NOTIFY channel")?;
        let listener = spawn_listener(relay_pool.clone(), channel, relay.wakeup())?;
        let running = relay.spawn();
        relay.wait_idle(Duration::from_secs(10)).await?;

        let producers = pg.pool(PRODUCERS).await?;
        let commits = produce(
            &PgOutbox::new(producers.clone(), outbox.config().clone())?,
            length,
        )
        .await?;
        producers.close().await;
        let deadline = Instant::now() + GIVE_UP;
        while acked.count() < commits.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        running.shutdown().await?;
        listener.stop().await;
        relay_pool.close().await;
        broker.clear().await?;

        let at = acked.at.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let first = commits.first().map(|c| c.1).ok_or("no commits")?;
        let last = commits.iter().map(|c| c.1).max().ok_or("no commits")?;
        let mut lags = Vec::new();
        for &(id, committed) in commits.iter().filter(|c| c.1 >= first + WARM_UP) {
            let acked = at
                .get(&id)
                .ok_or_else(|| format!("message {id} was not acknowledged within {GIVE_UP:?}"))?;
            lags.push(acked.saturating_duration_since(committed));
        }
        lags.sort_unstable();
        let samples = lags.len();
        let last_lag = *lags.last().ok_or("no samples")?;
        println!(
            "| {:<15} | {:>11.0} | {samples:>7} | {:>7.2} | {:>7.2} | {:>7.2} |",
            broker.name(),
            rate(commits.len(), last - first),
            ms(percentile(&lags, 500)),
            ms(percentile(&lags, 990)),
            ms(last_lag),
        );
    }
    println!(
        "\nlatency = the publish call returning with the broker's acks - the producer's COMMIT \
         returning; committed/s below {RATE} means PostgreSQL could not take the offered rate"
    );
    Ok(())
}

/// Offer [`RATE`] transactions per second for `length` (open loop: a slow commit does
/// not delay the next); returns each message's id and when its commit returned.
async fn produce(outbox: &PgOutbox, length: Duration) -> Res<Vec<(MessageId, Instant)>> {
    let total = u64::try_from(length.as_millis())? * u64::from(RATE) / 1_000;
    let interval = Duration::from_secs(1) / RATE;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..total {
        tokio::time::sleep_until((start + interval * u32::try_from(i)?).into()).await;
        let outbox = outbox.clone();
        tasks.push(tokio::spawn(async move {
            let message = order_message(i)?;
            let id = message.id();
            let mut tx = outbox.pool().begin().await?;
            outbox.enqueue(&mut tx, &[message]).await?;
            tx.commit().await?;
            Res::Ok((id, Instant::now()))
        }));
    }
    let mut commits = Vec::with_capacity(tasks.len());
    for task in tasks {
        commits.push(task.await??);
    }
    commits.sort_by_key(|c| c.1);
    Ok(commits)
}

async fn run(mode: Mode, cluster: Option<&Cluster>) -> Res<()> {
    let pg = Pg::setup(&var("OUTBOX_PG_URL")?).await?;
    let wal = match cluster {
        Some(cluster) => Some(Wal::setup(cluster).await?),
        None => None,
    };
    let brokers: Vec<Box<dyn Broker>> = vec![
        Box::new(NoBroker),
        Box::new(Nats::setup(&var("OUTBOX_NATS_URL")?).await?),
        Box::new(Rabbit::setup(&var("OUTBOX_AMQP_URL")?).await?),
    ];
    println!(
        "# broker_bench ({} mode{}, {} cores)",
        if mode.quick { "quick" } else { "full" },
        if mode.only_wal {
            ", OUTBOX_BENCH_ONLY=wal"
        } else {
            ""
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let result = async {
        throughput(mode, &pg, wal.as_ref(), &brokers).await?;
        if mode.only_wal {
            return Ok(());
        }
        latency(mode, &pg, &brokers).await
    }
    .await;
    for broker in &brokers {
        broker.teardown().await?;
    }
    if let Some(wal) = wal {
        // The slot is dropped after every drain; the cluster goes with its data.
        wal.pool.close().await;
    }
    pg.teardown().await?;
    result
}

/// `OUTBOX_BENCH_PROFILE=<nats|rabbitmq>:<raw|publisher>:<messages>:<batch>`: only that
/// workload, once, with nothing else in the process (no PostgreSQL, no cluster), for a
/// profiler or an instruction counter. Run it at two message counts under
/// `valgrind --tool=callgrind` and divide the difference in instructions by the
/// difference in messages: the set-up cancels out and what is left is the cost of one
/// message, repeatable on a busy machine.
async fn profile(spec: &str) -> Res<()> {
    let parts: Vec<&str> = spec.split(':').collect();
    let [broker, who, n, batch] = parts[..] else {
        return Err(
            format!("OUTBOX_BENCH_PROFILE={spec}: expected broker:who:messages:batch").into(),
        );
    };
    let (n, batch): (u64, usize) = (n.parse()?, batch.parse()?);
    let broker: Box<dyn Broker> = match broker {
        "nats" => Box::new(Nats::setup(&var("OUTBOX_NATS_URL")?).await?),
        "rabbitmq" => Box::new(Rabbit::setup(&var("OUTBOX_AMQP_URL")?).await?),
        other => return Err(format!("unknown broker {other}: nats or rabbitmq").into()),
    };
    let messages = orders(n)?;
    let before = cpu::sample(Server::None);
    let start = Instant::now();
    let result = match who {
        "raw" => broker.raw(&messages, batch).await.map(|_| ()),
        "publisher" => publisher_alone(&*broker, batch, &messages)
            .await
            .map(|_| ()),
        other => Err(format!("unknown workload {other}: raw or publisher").into()),
    };
    let (took, spent) = (start.elapsed(), cpu::since(before));
    broker.teardown().await?;
    result?;
    // The publisher's CPU includes converting each message as a claim would; the
    // instruction counts are the precise figure.
    println!(
        "{spec}: {:.0} msgs/s, {:.2} µs CPU per message",
        rate(messages.len(), took),
        spent.per(n).0
    );
    Ok(())
}

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var("OUTBOX_BENCH_PROFILE") {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        return match runtime.block_on(profile(&spec)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("broker_bench profile failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let quick = outbox_bench::quick();
    let only_wal = match std::env::var("OUTBOX_BENCH_ONLY") {
        Ok(only) if only.trim() == "wal" => true,
        Ok(only) if only.trim().is_empty() => false,
        Ok(only) => {
            eprintln!("broker_bench: OUTBOX_BENCH_ONLY={only}: only `wal` is known");
            return ExitCode::FAILURE;
        }
        Err(_) => false,
    };
    // The log-tailing relay's server: fsync on, as the shared server the polling relays
    // use (the testkit's clusters default to fsync off).
    let cluster = match Cluster::start_with(&[("wal_level", "logical"), ("fsync", "on")]) {
        Ok(cluster) => Some(cluster),
        Err(why) => {
            println!("log-tailing relay SKIPPED: no private PostgreSQL cluster: {why}");
            None
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("broker_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(Mode { quick, only_wal }, cluster.as_ref())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broker_bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
