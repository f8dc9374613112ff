//! The log-tailing relay for DynamoDB against the polling `DynamoOutbox` relay, both
//! on DynamoDB Local (or any endpoint in `OUTBOX_DYNAMODB_URL`), in one run, taking
//! turns:
//!
//! 1. **Drain**: a backlog of 20,000 messages of 1 KB drained by 1 and by 4 relays of
//!    each kind: messages per second, and CPU per message of this process (library,
//!    SDK, relays) and of DynamoDB Local. Rounds alternate the two kinds; the table
//!    gives each round and the medians, and the line
//!    `streams vs polling drain (1 relay): <x>x` ends it.
//! 2. **Capacity**: write and read units per message at 1 KB and 100 KB, as DynamoDB
//!    Local reports them, one message per transaction: the streams path's enqueue,
//!    lease writes (checkpoints, renewals) and part reads, against the polling path's
//!    enqueue, claim, body read and complete; ends with
//!    `streams / polling write units (1 KB): <r>` and the same for 100 KB.
//! 3. **Latency**: one message enqueued every 5 ms (200 msgs/s) for 10 s with one relay
//!    running: commit-to-publish latency p50 and p99, both kinds in turn; ends with
//!    `streams p99 at 200 msgs/s: <ms> ms`.
//!
//! Run: `scripts/services.sh && cargo bench -p outbox-bench --bench streams_bench`
//! (`--quick` or `OUTBOX_BENCH_QUICK=1`: a backlog of 2,000, one round, 3 s of
//! latency). Every run
//! starts a DynamoDB Local of its own (the jar `scripts/services.sh` installs): the
//! stream records a run leaves behind slow the next run's writes on a shared one.
//! DynamoDB Local has one stream shard whatever the load, so extra streams relays stand
//! by; figures measure the library's overhead and DynamoDB Local's, not DynamoDB's
//! latency. Server CPU counts every DynamoDB Local on the machine: run nothing else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_bench::dynamodb::{client as dynamodb, table_name as table};
use outbox_bench::{median, percentile, Counting};
use outbox_core::{NewMessage, Publisher, Relay, RelayConfig, Result};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_dynamodb_streams::{
    aws_sdk_dynamodb, aws_sdk_dynamodbstreams, StreamOutbox, StreamOutboxConfig, StreamRelay,
    StreamRelayConfig,
};
use outbox_testkit::cpu::{self, Server};
use outbox_testkit::dynamodb_local::PrivateDynamoDbLocal;
use outbox_testkit::RecordingPublisher;
use tokio_util::sync::CancellationToken;

fn streams(url: &str) -> aws_sdk_dynamodbstreams::Client {
    use aws_sdk_dynamodbstreams::config;
    aws_sdk_dynamodbstreams::Client::from_conf(
        config::Config::builder()
            .behavior_version(config::BehaviorVersion::latest())
            .endpoint_url(url)
            .region(config::Region::new("us-east-1"))
            .credentials_provider(config::Credentials::new(
                "outbox", "outbox", None, None, "bench",
            ))
            .build(),
    )
}

fn messages(n: usize, payload: usize) -> Vec<NewMessage> {
    let limits = outbox_core::MessageLimits::default().with_max_payload_bytes(512 * 1024);
    (0..n)
        .map(|_| {
            NewMessage::builder("bench")
                .limits(limits.clone())
                .payload(vec![b'x'; payload])
                .build()
                .unwrap()
        })
        .collect()
}

/// The two relays compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Streams,
    Polling,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Streams => "streams",
            Kind::Polling => "polling",
        }
    }
}

/// An installed outbox of either kind, and how to enqueue into it.
#[derive(Clone)]
enum Outbox {
    Streams(StreamOutbox),
    Polling(DynamoOutbox),
}

impl Outbox {
    async fn new(url: &str, kind: Kind, what: &str) -> Self {
        let limits = outbox_core::MessageLimits::default().with_max_payload_bytes(512 * 1024);
        match kind {
            Kind::Streams => {
                let o = StreamOutbox::new(
                    dynamodb(url),
                    StreamOutboxConfig::default()
                        .with_table(table(what))
                        .with_limits(limits),
                )
                .unwrap();
                o.install().await.unwrap();
                Outbox::Streams(o)
            }
            Kind::Polling => {
                let o = DynamoOutbox::new(
                    dynamodb(url),
                    DynamoOutboxConfig::default()
                        .with_table(table(what))
                        .with_shards(16)
                        .with_shard_leases(Some(Duration::from_secs(6)))
                        .with_limits(limits),
                )
                .unwrap();
                o.install().await.unwrap();
                Outbox::Polling(o)
            }
        }
    }

    async fn enqueue(&self, batch: &[NewMessage]) {
        self.enqueue_with(Vec::new(), batch).await;
    }

    async fn enqueue_with(
        &self,
        writes: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
        batch: &[NewMessage],
    ) {
        match self {
            Outbox::Streams(o) => o.enqueue(writes, batch).await.unwrap(),
            Outbox::Polling(o) => o.enqueue(writes, batch).await.unwrap(),
        }
    }

    fn table(&self) -> String {
        match self {
            Outbox::Streams(o) => o.config().table().to_owned(),
            Outbox::Polling(o) => o.config().table().to_owned(),
        }
    }

    /// Enqueue `all`, 25 per transaction, one transaction after another: DynamoDB
    /// Local serialises writes to a table with a stream badly (concurrent
    /// transactions wait on its lock and time out).
    async fn backlog(&self, all: Vec<NewMessage>) {
        for chunk in all.chunks(25) {
            self.enqueue(chunk).await;
        }
    }

    async fn drop(&self) {
        match self {
            Outbox::Streams(o) => o.drop_tables().await.unwrap(),
            Outbox::Polling(o) => o.drop_table().await.unwrap(),
        }
    }
}

/// Relays of either kind, running.
struct Running {
    stop: CancellationToken,
    streams: Vec<tokio::task::JoinHandle<Result<outbox_dynamodb_streams::StreamRelayReport>>>,
    polling: Vec<outbox_core::RelayHandle>,
    /// The polling relays' stores: their counters hold the claims and settles.
    stores: Vec<DynamoOutbox>,
}

impl Running {
    fn start(url: &str, outbox: &Outbox, relays: usize, publisher: Arc<dyn Publisher>) -> Self {
        let stop = CancellationToken::new();
        let mut running = Running {
            stop: stop.clone(),
            streams: Vec::new(),
            polling: Vec::new(),
            stores: Vec::new(),
        };
        for i in 0..relays {
            match outbox {
                Outbox::Streams(o) => {
                    let relay = StreamRelay::new(
                        o.clone(),
                        streams(url),
                        Arc::clone(&publisher),
                        StreamRelayConfig::default().with_name(format!("bench-{i}")),
                    )
                    .unwrap();
                    running.streams.push(tokio::spawn(relay.run(stop.clone())));
                }
                Outbox::Polling(o) => {
                    // Its own store per relay: each holds its own shard leases.
                    let store = DynamoOutbox::new(o.client().clone(), o.config().clone()).unwrap();
                    let config = RelayConfig::default()
                        .with_name(format!("bench-{i}"))
                        .with_batch_size(100)
                        .with_publish_batch_size(100)
                        .with_publish_concurrency(4)
                        .with_poll_interval(Duration::from_millis(5))
                        .with_max_poll_interval(Duration::from_millis(50));
                    running.stores.push(store.clone());
                    running.polling.push(
                        Relay::new(Arc::new(store), Arc::clone(&publisher), config)
                            .unwrap()
                            .spawn(),
                    );
                }
            }
        }
        running
    }

    async fn stop(self) {
        self.stop.cancel();
        for h in self.streams {
            h.await.unwrap().unwrap();
        }
        for h in self.polling {
            h.shutdown().await.unwrap();
        }
    }
}

/// One drain: msgs/s, bench and server CPU µs per message.
async fn drain(kind: Kind, relays: usize, backlog: usize) -> (f64, f64, f64) {
    let local = private_local();
    let url = &local.url();
    let outbox = Outbox::new(url, kind, "bench_drain").await;
    outbox.backlog(messages(backlog, 1024)).await;
    let publisher = RecordingPublisher::new();
    let cpu_start = cpu::sample(Server::DynamoDbLocal);
    let start = Instant::now();
    let running = Running::start(url, &outbox, relays, Arc::new(publisher.clone()));
    publisher
        .wait_for_unique(backlog, Duration::from_secs(1200))
        .await
        .unwrap();
    let rate = backlog as f64 / start.elapsed().as_secs_f64();
    let (bench_cpu, server_cpu) = cpu::since(cpu_start).per(backlog as u64);
    running.stop().await;
    outbox.drop().await;
    (rate, bench_cpu, server_cpu)
}

async fn drain_bench(backlog: usize, rounds: usize) -> f64 {
    println!("\n## 1. Drain of {backlog} messages of 1 KB\n");
    println!(
        "One backlog per run, enqueued 25 per transaction (one writer) before the relays start; the clock \
         runs from the relays' start to the last first publish. The kinds take turns in each \
         round. Polling: `DynamoOutbox` with 16 shards and shard leases, batch 100, 4 publish \
         calls in flight. Streams: `StreamRelay` defaults (reads of 1,000 records, 4 calls \
         of 100 in flight). Bench CPU: this process; server CPU: DynamoDB Local.\n"
    );
    println!("| relays | round | kind | msgs/s | bench CPU µs/msg | server CPU µs/msg |");
    println!("|---:|---:|---|---:|---:|---:|");
    let mut ratio_one = f64::NAN;
    let mut summary = Vec::new();
    for relays in [1usize, 4] {
        let mut by_kind: [(Vec<f64>, Vec<f64>, Vec<f64>); 2] = Default::default();
        for round in 1..=rounds {
            let order = if round % 2 == 1 {
                [Kind::Streams, Kind::Polling]
            } else {
                [Kind::Polling, Kind::Streams]
            };
            for kind in order {
                let (rate, bench, server) = drain(kind, relays, backlog).await;
                let slot = &mut by_kind[usize::from(kind == Kind::Polling)];
                slot.0.push(rate);
                slot.1.push(bench);
                slot.2.push(server);
                println!(
                    "| {relays} | {round} | {} | {rate:.0} | {bench:.0} | {server:.0} |",
                    kind.name()
                );
            }
        }
        let [s, p] = by_kind.map(|(r, b, c)| (median(&r), median(&b), median(&c)));
        if relays == 1 {
            ratio_one = s.0 / p.0;
        }
        summary.push((relays, s, p));
    }
    println!("\nMedians:\n");
    println!("| relays | streams msgs/s | polling msgs/s | streams / polling | streams CPU µs/msg (bench + server) | polling CPU µs/msg (bench + server) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (relays, s, p) in summary {
        println!(
            "| {relays} | {:.0} | {:.0} | {:.2}x | {:.0} + {:.0} | {:.0} + {:.0} |",
            s.0,
            p.0,
            s.0 / p.0,
            s.1,
            s.2,
            p.1,
            p.2
        );
    }
    println!("\nstreams vs polling drain (1 relay): {ratio_one:.2}x");
    ratio_one
}

/// Units per message of one path at one payload size: (writes, reads) by step.
/// A business write beside a message: a small order item in the outbox's table.
fn order_write(table: &str) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    let id = uuid::Uuid::new_v4().to_string();
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item("pk", AttributeValue::S(format!("order#{id}")))
                .item("sk", AttributeValue::S("order".into()))
                .item("status", AttributeValue::S("paid".into()))
                .build()
                .unwrap(),
        )
        .build()
}

async fn capacity(
    kind: Kind,
    payload: usize,
    n: usize,
    with_order: bool,
) -> Vec<(&'static str, f64)> {
    let local = private_local();
    let url = &local.url();
    let outbox = Outbox::new(url, kind, "bench_capacity").await;
    let table = outbox.table();
    let order = if with_order { 2.0 } else { 0.0 };
    for m in messages(n, payload) {
        let writes = if with_order {
            vec![order_write(&table)]
        } else {
            Vec::new()
        };
        outbox.enqueue_with(writes, std::slice::from_ref(&m)).await;
    }
    let publisher = RecordingPublisher::new();
    let running = Running::start(url, &outbox, 1, Arc::new(publisher.clone()));
    publisher
        .wait_for_unique(n, Duration::from_secs(600))
        .await
        .unwrap();
    let relay_stores = running.stores.clone();
    running.stop().await;
    let per = |x: f64| x / n as f64;
    let sum = |f: fn(&outbox_dynamodb::OutboxMetrics) -> f64| -> f64 {
        relay_stores.iter().map(|s| f(&s.metrics())).sum()
    };
    let rows = match &outbox {
        Outbox::Streams(o) => {
            let m = o.metrics();
            vec![
                ("enqueue (WCU)", per(m.enqueue_units) - order),
                ("lease table writes (WCU)", per(m.lease_write_units)),
                ("lease table reads (RCU)", per(m.lease_read_units)),
                ("later parts read (RCU)", per(m.part_read_units)),
            ]
        }
        Outbox::Polling(o) => {
            vec![
                ("enqueue (WCU)", per(o.metrics().enqueue_units) - order),
                ("claim writes (WCU)", per(sum(|m| m.claim_write_units))),
                ("complete (WCU)", per(sum(|m| m.settle_units))),
                ("claim reads (RCU)", per(sum(|m| m.claim_read_units))),
                ("body reads (RCU)", per(sum(|m| m.body_read_units))),
                (
                    "shard leases and sweeps (WCU + RCU)",
                    per(sum(|m| m.upkeep_units)),
                ),
            ]
        }
    };
    outbox.drop().await;
    rows
}

async fn capacity_bench(n: usize) -> [f64; 2] {
    println!("\n## 2. Capacity units per message ({n} messages, one per enqueue)\n");
    println!(
        "As DynamoDB Local reports them (`ReturnConsumedCapacity = TOTAL`). `alone`: the \
         message is the enqueue's only write (the streams outbox sends a conditional \
         `PutItem`, the polling one a transaction of state and body); `with an order`: \
         beside one small business item in the same `TransactWriteItems`, whose 2 units \
         are left out of the figures. A transaction bills two write units per KB of each \
         item. Reading the stream costs stream read request units, billed apart and not \
         reported per request: not in the table. Lease table figures are per message of \
         this run (they are per round and per read, not per message).\n"
    );
    println!("| payload | enqueue | kind | step | units/msg |");
    println!("|---:|---|---|---|---:|");
    let mut ratios = [f64::NAN; 2];
    for (slot, payload, with_order) in [
        (0usize, 1024usize, true),
        (1, 100 * 1024, true),
        (2, 1024, false),
        (3, 100 * 1024, false),
    ] {
        let mode = if with_order { "with an order" } else { "alone" };
        let mut writes = [0.0; 2];
        for kind in [Kind::Streams, Kind::Polling] {
            let rows = capacity(kind, payload, n, with_order).await;
            for (step, units) in &rows {
                println!(
                    "| {} KB | {mode} | {} | {step} | {units:.2} |",
                    payload / 1024,
                    kind.name()
                );
            }
            // Writes of the message path: enqueue, claim and complete (polling), enqueue
            // and the lease table (streams).
            writes[usize::from(kind == Kind::Polling)] = rows
                .iter()
                .filter(|(s, _)| s.contains("WCU") && !s.contains("sweeps"))
                .map(|(_, u)| u)
                .sum();
        }
        let ratio = writes[0] / writes[1];
        if slot < 2 {
            ratios[slot] = ratio;
        }
        println!(
            "| {} KB | {mode} | | **write units: streams {:.2}, polling {:.2}** | **{ratio:.2}** |",
            payload / 1024,
            writes[0],
            writes[1],
        );
    }
    println!(
        "\nstreams / polling write units (1 KB, with an order): {:.2}",
        ratios[0]
    );
    println!(
        "streams / polling write units (100 KB, with an order): {:.2}",
        ratios[1]
    );
    ratios
}

async fn latency(kind: Kind, seconds: u64) -> (Duration, Duration, usize) {
    let local = private_local();
    let url = &local.url();
    let outbox = Outbox::new(url, kind, "bench_latency").await;
    let timing = Arc::new(Counting::with_latencies());
    let running = Running::start(url, &outbox, 1, timing.clone());
    // Let the relay take its lease and reach the end of the (empty) stream.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = usize::try_from(seconds * 200).unwrap();
    let start = tokio::time::Instant::now();
    for (i, m) in messages(n, 1024).into_iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_millis(5 * i as u64)).await;
        outbox.enqueue(std::slice::from_ref(&m)).await;
    }
    timing
        .wait_for(n as u64, Duration::from_secs(120))
        .await
        .unwrap();
    running.stop().await;
    outbox.drop().await;
    let mut seen = timing.latencies();
    seen.sort();
    (percentile(&seen, 500), percentile(&seen, 990), seen.len())
}

async fn latency_bench(seconds: u64) -> Duration {
    println!("\n## 3. Commit-to-publish latency at 200 msgs/s ({seconds} s, one relay)\n");
    println!(
        "One message of 1 KB per transaction every 5 ms; latency from the enqueue's \
         timestamp (taken just before the commit) to the publish call. Streams: defaults \
         (250 ms between empty reads). Polling: polls from 5 ms backing off to 50 ms.\n"
    );
    println!("| kind | messages | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    let mut streams_p99 = Duration::ZERO;
    for kind in [Kind::Streams, Kind::Polling] {
        let (p50, p99, n) = latency(kind, seconds).await;
        if kind == Kind::Streams {
            streams_p99 = p99;
        }
        println!(
            "| {} | {n} | {:.0} | {:.0} |",
            kind.name(),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    println!(
        "\nstreams p99 at 200 msgs/s: {:.0} ms",
        streams_p99.as_secs_f64() * 1e3
    );
    streams_p99
}

/// A fresh DynamoDB Local for one run: stream records left by earlier runs would slow
/// the next one's writes.
fn private_local() -> PrivateDynamoDbLocal {
    PrivateDynamoDbLocal::start()
        .unwrap_or_else(|why| panic!("{why} (run `scripts/services.sh` to install it)"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = outbox_bench::quick();
    let (backlog, rounds, capacity_n, seconds) = if quick {
        (2_000, 1, 20, 3)
    } else {
        (20_000, 2, 100, 10)
    };
    println!("# outbox-dynamodb-streams bench (a fresh private DynamoDB Local per run)");
    drain_bench(backlog, rounds).await;
    capacity_bench(capacity_n).await;
    latency_bench(seconds).await;
}
