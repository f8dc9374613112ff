//! Benchmarks against DynamoDB Local (or any endpoint in `OUTBOX_DYNAMODB_URL`):
//!
//! 1. dedup `record` of new ids and of duplicates, at concurrency 1, 8 and 64, against
//!    the same raw SDK calls (the same conditional `PutItem`) in the same run, rounds
//!    interleaved so both see the same machine;
//! 2. relays: 1, 2, 4 and 8 relays (each a store of its own, dividing the shards with
//!    shard leases) draining a backlog of 20,000 messages: messages per second, capacity
//!    units per message, and refused conditional writes per message over the whole
//!    drain and in steady state (between 25% and 90% published), with the same drain
//!    without shard leases (every relay reading every shard) as the baseline in the
//!    same run; ends with the line `refused writes per message (4 relays): <x>`
//!    (steady state, shard leases);
//! 3. capacity units per operation with 1 KB and 100 KB payloads: enqueue, claim,
//!    complete, fail (retry) and a dedup record, next to the design minimum of the crate
//!    docs, ending with the line
//!    `write units per claim+complete (100 KB payload): <y>`.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo bench -p outbox-bench --bench dynamodb_bench`
//! (`--quick` or `OUTBOX_BENCH_QUICK=1` runs a tenth of the operations and a backlog of
//! 2,000; `--capacity` only the capacity table, also as `cargo test -p outbox-bench
//! --bench dynamodb_bench -- --capacity`; `--relays` only the relay table). Figures from DynamoDB Local measure the
//! library's overhead, request counts and capacity as DynamoDB Local reports it, not
//! DynamoDB's latency.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use aws_sdk_dynamodb::Client;
use outbox_bench::dynamodb::{client, table_name as table};
use outbox_bench::ops_per_sec as rate;
use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt, ConsumerName,
    Dedup, DedupStore, MessageId, NewMessage, OutboxAdmin, OutboxStore, Relay, RelayConfig,
};
use outbox_dynamodb::{DynamoDedupConfig, DynamoDedupStore, DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::cpu::{self, Server};
use outbox_testkit::RecordingPublisher;

/// The raw SDK call the dedup store makes for a record: the same key layout, item and
/// condition, without the library around it.
async fn raw_record(client: &Client, table: &str, consumer: &str, id: MessageId) -> bool {
    // The store's key: one partition key, the id's text then the consumer.
    let id_text = id.as_uuid().hyphenated().to_string();
    let now = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap();
    let expires = now + 3_600_000_000;
    let sent = client
        .put_item()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("{id_text}{consumer}")))
        .item("expires_us", AttributeValue::N(expires.to_string()))
        .item(
            "ttl",
            AttributeValue::N((expires / 1_000_000 + 1).to_string()),
        )
        .condition_expression("attribute_not_exists(#pk) OR #e <= :now")
        .expression_attribute_names("#pk", "pk")
        .expression_attribute_names("#e", "expires_us")
        .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
        .send()
        .await;
    match sent {
        Ok(_) => true,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            false
        }
        Err(e) => panic!("raw put failed: {e:?}"),
    }
}

async fn dedup_bench(client: &Client, scale: usize) {
    let store = DynamoDedupStore::new(
        client.clone(),
        DynamoDedupConfig::default()
            .with_table(table("bench_dedup"))
            .with_retention(Duration::from_secs(3600)),
    )
    .unwrap();
    store.install().await.unwrap();
    let store = Arc::new(store);
    let table = store.config().table().to_owned();
    let consumer = ConsumerName::new("bench").unwrap();
    println!("\n## dedup (ops/s, library vs raw SDK; rounds interleaved, best of 2)\n");
    println!("| operation | concurrency | library | raw SDK | library overhead |");
    println!("|---|---:|---:|---:|---:|");
    for concurrency in [1usize, 8, 64] {
        let ops = (if concurrency == 1 { 100 } else { 500 }) * scale;
        for dup in [false, true] {
            let (mut lib_best, mut raw_best) = (0f64, 0f64);
            for round in 0..2 {
                // Ids recorded beforehand when measuring duplicates.
                let lib_ids: Arc<Vec<MessageId>> =
                    Arc::new((0..ops).map(|_| MessageId::new()).collect());
                let raw_ids: Arc<Vec<MessageId>> =
                    Arc::new((0..ops).map(|_| MessageId::new()).collect());
                if dup {
                    let all: Arc<Vec<MessageId>> =
                        Arc::new(lib_ids.iter().chain(raw_ids.iter()).copied().collect());
                    let (st, c) = (Arc::clone(&store), consumer.clone());
                    rate(all.len(), 64, move |i| {
                        let (st, c, id) = (Arc::clone(&st), c.clone(), all[i]);
                        async move {
                            let _ = st.record(&c, id).await.unwrap();
                        }
                    })
                    .await;
                }
                let expect = if dup { Dedup::Duplicate } else { Dedup::New };
                let (s, c, ids) = (Arc::clone(&store), consumer.clone(), Arc::clone(&lib_ids));
                let lib_run = move || {
                    let (s, c, ids) = (Arc::clone(&s), c.clone(), Arc::clone(&ids));
                    rate(ops, concurrency, move |i| {
                        let (s, c, id) = (Arc::clone(&s), c.clone(), ids[i]);
                        async move { assert_eq!(s.record(&c, id).await.unwrap(), expect) }
                    })
                };
                let (cl, t, ids) = (client.clone(), table.clone(), Arc::clone(&raw_ids));
                let raw_run = move || {
                    let (cl, t, ids) = (cl.clone(), t.clone(), Arc::clone(&ids));
                    rate(ops, concurrency, move |i| {
                        let (cl, t, id) = (cl.clone(), t.clone(), ids[i]);
                        async move { assert_eq!(raw_record(&cl, &t, "bench", id).await, !dup) }
                    })
                };
                // Alternate which goes first, so warm-up favours neither.
                let (lib, raw) = if round % 2 == 0 {
                    let lib = lib_run().await;
                    (lib, raw_run().await)
                } else {
                    let raw = raw_run().await;
                    (lib_run().await, raw)
                };
                lib_best = lib_best.max(lib);
                raw_best = raw_best.max(raw);
            }
            let name = if dup {
                "detect duplicate"
            } else {
                "record new"
            };
            println!(
                "| {name} | {concurrency} | {lib_best:.0} | {raw_best:.0} | {:+.1}% |",
                (raw_best / lib_best - 1.0) * 100.0
            );
        }
    }
    store.drop_table().await.unwrap();
}

/// What one relay run measured.
struct RelayRun {
    rate: f64,
    /// Refused conditional writes per message, whole run and steady state.
    refused: f64,
    steady: f64,
    /// Claim + complete write units and claim read units per message.
    writes: f64,
    reads: f64,
    /// CPU microseconds per message while draining: this process, DynamoDB Local.
    cpu: f64,
    server_cpu: f64,
}

/// One relay run: `relays` stores (shard leases on or off) draining `backlog`
/// messages.
async fn relay_run(client: &Client, relays: usize, backlog: usize, leases: bool) -> RelayRun {
    let config = DynamoOutboxConfig::default()
        .with_table(table("bench_relays"))
        .with_shards(16)
        .with_shard_leases(leases.then_some(Duration::from_secs(6)));
    let writer = DynamoOutbox::new(client.clone(), config.clone()).unwrap();
    writer.install().await.unwrap();
    let batch: Arc<Vec<NewMessage>> = Arc::new(
        (0..backlog)
            .map(|i| {
                NewMessage::builder("bench")
                    .payload(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(200)).into_bytes())
                    .build()
                    .unwrap()
            })
            .collect(),
    );
    let chunks = backlog.div_ceil(50);
    let (w, b) = (writer.clone(), Arc::clone(&batch));
    rate(chunks, 8, move |i| {
        let (w, b) = (w.clone(), Arc::clone(&b));
        async move {
            let end = ((i + 1) * 50).min(b.len());
            w.enqueue(Vec::new(), &b[i * 50..end]).await.unwrap();
        }
    })
    .await;
    let stores: Vec<DynamoOutbox> = (0..relays)
        .map(|_| DynamoOutbox::new(client.clone(), config.clone()).unwrap())
        .collect();
    let publisher = RecordingPublisher::new();
    let start = Instant::now();
    let cpu_start = cpu::sample(Server::DynamoDbLocal);
    let handles: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let config = RelayConfig::default()
                .with_name(format!("bench-{i}"))
                .with_batch_size(100)
                .with_publish_batch_size(100)
                .with_publish_concurrency(4)
                .with_poll_interval(Duration::from_millis(5))
                .with_max_poll_interval(Duration::from_millis(50));
            Relay::new(Arc::new(store.clone()), Arc::new(publisher.clone()), config)
                .unwrap()
                .spawn()
        })
        .collect();
    let totals = |stores: &[DynamoOutbox]| {
        stores.iter().fold((0u64, 0u64), |(r, c), s| {
            let m = s.metrics();
            (r + m.refused_writes, c + m.claimed)
        })
    };
    publisher
        .wait_for_unique(backlog / 4, Duration::from_secs(1200))
        .await
        .unwrap();
    let (refused_a, claimed_a) = totals(&stores);
    publisher
        .wait_for_unique(backlog * 9 / 10, Duration::from_secs(1200))
        .await
        .unwrap();
    let (refused_b, claimed_b) = totals(&stores);
    publisher
        .wait_for_unique(backlog, Duration::from_secs(1200))
        .await
        .unwrap();
    let elapsed = start.elapsed();
    let (cpu, server_cpu) = cpu::since(cpu_start).per(backlog as u64);
    for h in handles {
        h.shutdown().await.unwrap();
    }
    assert_eq!(publisher.duplicates(), 0);
    let (refused, claimed) = totals(&stores);
    let (mut writes, mut reads) = (0.0, 0.0);
    for s in &stores {
        let m = s.metrics();
        writes += m.claim_write_units + m.settle_units;
        reads += m.claim_read_units;
    }
    writer.drop_table().await.unwrap();
    let per = |x: f64, n: u64| x / n.max(1) as f64;
    RelayRun {
        rate: backlog as f64 / elapsed.as_secs_f64(),
        refused: per(refused as f64, claimed),
        steady: per((refused_b - refused_a) as f64, claimed_b - claimed_a),
        writes: per(writes, claimed),
        reads: per(reads, claimed),
        cpu,
        server_cpu,
    }
}

async fn relay_bench(client: &Client, backlog: usize) -> f64 {
    println!(
        "\n## relays draining a backlog of {backlog} messages (16 shards, batch 100, 250-byte payloads)\n"
    );
    println!(
        "Each relay is a store of its own. `leases`: relays divide the shards with shard \
              leases (6 s); `all shards`: the baseline, every relay claims from every shard. \
              Steady state: between 25% and 90% of the backlog published. The two modes take \
              turns for each relay count. Bench CPU: this process (library, SDK, relays, \
              publisher); server CPU: DynamoDB Local's processes, whose saturation bounds the \
              drain on a small machine whatever the relay count.\n"
    );
    println!(
        "| relays | mode | msgs/s | vs 1 relay | refused writes/msg (whole drain) | refused writes/msg (steady state) | claim+complete WCU/msg | claim RCU/msg | bench CPU µs/msg | server CPU µs/msg |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut four = f64::NAN;
    let mut one = [f64::NAN; 2];
    for relays in [1usize, 2, 4, 8] {
        for (slot, leases) in [(0usize, true), (1, false)] {
            let run = relay_run(client, relays, backlog, leases).await;
            if relays == 1 {
                one[slot] = run.rate;
            }
            if relays == 4 && leases {
                four = run.steady;
            }
            println!(
                "| {relays} | {} | {:.0} | {:.2}x | {:.3} | {:.3} | {:.2} | {:.2} | {:.0} | {:.0} |",
                if leases { "leases" } else { "all shards" },
                run.rate,
                run.rate / one[slot],
                run.refused,
                run.steady,
                run.writes,
                run.reads,
                run.cpu,
                run.server_cpu,
            );
        }
    }
    println!("\nrefused writes per message (4 relays): {four:.3}");
    four
}

/// One payload size's capacity, per message, from the store's `ConsumedCapacity`
/// counters (deltas around each step).
#[derive(Debug, Default, Clone, Copy)]
struct CapacityRow {
    enqueue: f64,
    claim_write: f64,
    claim_read: f64,
    body_read: f64,
    complete: f64,
    retry: f64,
    release: f64,
    dead_letter: f64,
    requeue: f64,
    discard: f64,
    /// A body renewal by the sweep: its share of the index pages, the state read, the
    /// body items' writes and the state write recording the expiry.
    renewal: f64,
}

/// Units per message of each operation for `payload`-byte messages: `messages` are
/// enqueued one per transaction and claimed; a quarter are completed, a quarter retried,
/// a quarter released and a quarter dead-lettered; the released ones are made to look
/// as if they had waited long with little body left and renewed by a sweep; the dead
/// letters are requeued, dead-lettered again and discarded. A per-key store with unkeyed messages, so
/// completes are one `DeleteItem` each and report their capacity (an unordered store's
/// PartiQL batch reports none on DynamoDB Local).
async fn capacity_row(client: &Client, payload: usize, messages: usize) -> CapacityRow {
    let limits = outbox_core::MessageLimits::default().with_max_payload_bytes(512 * 1024);
    let outbox = DynamoOutbox::new(
        client.clone(),
        DynamoOutboxConfig::default()
            .with_table(table("bench_capacity"))
            .with_shards(4)
            .with_ordering(outbox_core::KeyOrder::PerKey)
            .with_limits(limits.clone()),
    )
    .unwrap();
    outbox.install().await.unwrap();
    let batch: Vec<NewMessage> = (0..messages)
        .map(|_| {
            NewMessage::builder("bench")
                .limits(limits.clone())
                .payload(vec![b'x'; payload])
                .build()
                .unwrap()
        })
        .collect();
    for m in &batch {
        outbox
            .enqueue(Vec::new(), std::slice::from_ref(m))
            .await
            .unwrap();
    }
    let after_enqueue = outbox.metrics();
    let lease = Duration::from_secs(60);
    let mut claimed = Vec::new();
    while claimed.len() < messages {
        let got = outbox
            .claim(ClaimRequest::new(messages - claimed.len(), lease).unwrap())
            .await
            .unwrap();
        assert!(!got.is_empty(), "every message is due");
        claimed.extend(got);
    }
    let after_claim = outbox.metrics();
    let quarter = messages / 4;
    let settle = |m: outbox_dynamodb::OutboxMetrics| m.settle_units;
    let mut step = settle(after_claim);
    let mut per = |now: f64| {
        let units = (now - step) / quarter as f64;
        step = now;
        units
    };
    let (done, rest) = claimed.split_at(quarter);
    let (retried, rest) = rest.split_at(quarter);
    let (released, dead) = rest.split_at(quarter);
    for c in done {
        outbox.complete_one(&c.lease).await.unwrap();
    }
    let complete = per(settle(outbox.metrics()));
    let later = Disposition::Retry {
        after: Duration::from_secs(3600),
    };
    for c in retried {
        outbox
            .fail_one(Failure::new(c.lease, "bench", later))
            .await
            .unwrap();
    }
    let retry = per(settle(outbox.metrics()));
    let leases: Vec<_> = released.iter().map(|c| c.lease).collect();
    assert_eq!(outbox.release(&leases).await.unwrap().applied, quarter);
    let release = per(settle(outbox.metrics()));
    let before = outbox.metrics().body_renewal_units;
    for c in released {
        at_risk(client, &outbox, c.message.id).await;
    }
    assert_eq!(outbox.renew_bodies().await.unwrap(), quarter as u64);
    let renewal = (outbox.metrics().body_renewal_units - before) / quarter as f64;
    for c in &dead[..quarter] {
        outbox
            .fail_one(Failure::new(c.lease, "bench", Disposition::DeadLetter))
            .await
            .unwrap();
    }
    let dead_letter = per(settle(outbox.metrics()));
    let ids: Vec<MessageId> = dead[..quarter].iter().map(|c| c.message.id).collect();
    let selection = outbox_core::DeadLetterSelection::Ids(ids.clone());
    let admin = |m: outbox_dynamodb::OutboxMetrics| m.admin_units + m.claim_read_units;
    let before = admin(outbox.metrics());
    assert_eq!(
        outbox.requeue_dead(&selection).await.unwrap(),
        quarter as u64
    );
    let requeue = (admin(outbox.metrics()) - before) / quarter as f64;
    // Dead-letter them again (claimed by id), then discard.
    let again = outbox
        .claim_ids(&outbox_core::store::ClaimIds::new(&ids, lease).unwrap())
        .await
        .unwrap();
    for c in again.iter() {
        outbox
            .fail_one(Failure::new(c.lease, "bench", Disposition::DeadLetter))
            .await
            .unwrap();
    }
    let before = outbox.metrics().admin_units;
    assert_eq!(
        outbox.discard_dead(&selection).await.unwrap(),
        quarter as u64
    );
    let discard = (outbox.metrics().admin_units - before) / quarter as f64;
    outbox.drop_table().await.unwrap();

    let n = messages as f64;
    CapacityRow {
        enqueue: after_enqueue.enqueue_units / n,
        claim_write: after_claim.claim_write_units / n,
        claim_read: after_claim.claim_read_units / n,
        body_read: after_claim.body_read_units / n,
        complete,
        retry,
        release,
        dead_letter,
        requeue,
        discard,
        renewal,
    }
}

/// Make message `id` look as if it had waited two days with a minute of body left:
/// its availability and `due` two days back, its body's expiry (on the state and on
/// every body item) a minute from now. Raw writes, not counted by the store.
async fn at_risk(client: &Client, outbox: &DynamoOutbox, id: MessageId) {
    let pk = AttributeValue::S(format!("m#{}", id.as_uuid().hyphenated()));
    let back_us: u128 = 2 * 24 * 3600 * 1_000_000;
    let soon = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 60;
    let n = |v: u128| AttributeValue::N(v.to_string());
    let sk = |s: &str| AttributeValue::S(s.to_owned());
    client
        .update_item()
        .table_name(outbox.config().table())
        .key("pk", pk.clone())
        .key("sk", sk("s"))
        .update_expression(
            "SET avail_us = avail_us - :back, #due = #due - :dueback, body_exp = :soon",
        )
        .expression_attribute_names("#due", "due")
        .expression_attribute_values(":back", n(back_us))
        .expression_attribute_values(":dueback", n(back_us * 10_u128.pow(16)))
        .expression_attribute_values(":soon", n(u128::from(soon)))
        .send()
        .await
        .unwrap();
    let parts = client
        .query()
        .table_name(outbox.config().table())
        .key_condition_expression("pk = :pk AND begins_with(sk, :b)")
        .expression_attribute_values(":pk", pk.clone())
        .expression_attribute_values(":b", sk("b#"))
        .send()
        .await
        .unwrap();
    for part in parts.items() {
        client
            .update_item()
            .table_name(outbox.config().table())
            .key("pk", pk.clone())
            .key("sk", part["sk"].clone())
            .update_expression("SET #ttl = :soon")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":soon", n(u128::from(soon)))
            .send()
            .await
            .unwrap();
    }
}

/// The write units of the crate docs' table for a payload of `payload` bytes (a state
/// item under 1 KB: S = 1), in [`CapacityRow`]'s order past the reads. `B` is the body
/// items' write units: one item per 300 KiB, each about 70 bytes more than its part.
fn design_row(payload: usize) -> CapacityRow {
    let part = 300 * 1024;
    let parts: Vec<usize> = if payload == 0 {
        vec![0]
    } else {
        (0..payload.div_ceil(part))
            .map(|i| (payload - i * part).min(part))
            .collect()
    };
    let b: f64 = parts.iter().map(|p| (p + 70).div_ceil(1024) as f64).sum();
    // A query adds up the items' sizes before rounding to 4 KB steps.
    let body_read = parts.iter().map(|p| p + 70).sum::<usize>().div_ceil(4096) as f64 / 2.0;
    CapacityRow {
        enqueue: 2.0 + 1.0 + 2.0 * b,
        claim_write: 3.0,
        claim_read: f64::NAN,
        body_read,
        complete: 2.0,
        retry: 3.0,
        release: 3.0,
        // One transaction: the state twice, the `due` delete and `dead` put once each.
        dead_letter: 2.0 + 1.0 + 1.0 + 2.0 * b,
        // One transaction each, after a strongly consistent read (1): the state twice,
        // index entries once, the body items twice.
        requeue: 1.0 + 2.0 + 1.0 + 1.0 + 2.0 * b,
        discard: 1.0 + 2.0 + 1.0 + 2.0 * b,
        // The state read (eventually consistent), the body items, the state write; the
        // index pages' share is not in the minimum.
        renewal: 0.5 + b + 1.0,
    }
}

fn print_row(payload: usize, what: &str, r: &CapacityRow) {
    println!(
        "| {} KB | {what} | {:.1} | {:.1} | {:.2} + {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        payload / 1024,
        r.enqueue,
        r.claim_write,
        r.claim_read,
        r.body_read,
        r.complete,
        r.retry,
        r.release,
        r.dead_letter,
        r.requeue,
        r.discard,
        r.renewal,
    );
}

/// A dedup record's units: independent of the payload; measured with the store's own
/// item through the raw call (the store keeps no capacity counters).
async fn dedup_units(client: &Client) -> f64 {
    let dedup = DynamoDedupStore::new(
        client.clone(),
        DynamoDedupConfig::default().with_table(table("bench_capacity_dedup")),
    )
    .unwrap();
    dedup.install().await.unwrap();
    let id = MessageId::new();
    let recorded = client
        .put_item()
        .table_name(dedup.config().table())
        .item(
            "pk",
            AttributeValue::S(format!("{}bench", id.as_uuid().hyphenated())),
        )
        .item("expires_us", AttributeValue::N("99999999999999999".into()))
        .item("ttl", AttributeValue::N("99999999999".into()))
        .condition_expression("attribute_not_exists(pk)")
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .unwrap();
    dedup.drop_table().await.unwrap();
    recorded
        .consumed_capacity()
        .and_then(|c| c.capacity_units())
        .unwrap_or(f64::NAN)
}

async fn capacity_bench(client: &Client) -> f64 {
    println!(
        "\n## capacity units per message and operation (per-key store, unkeyed messages, \
         Retention::Delete, 20 messages, 4 shards)\n"
    );
    println!(
        "Measured: the `ConsumedCapacity` the endpoint returns (TOTAL: table and index \
         writes), per message. Claim reads: index pages and state reads + body reads. \
         Requeue and discard: the state read and the writes. Renewal (by the sweep): its \
         share of the index pages, the state read and the writes. Design minimum: the \
         crate README's table (S = 1).\n"
    );
    println!(
        "| payload | row | enqueue | claim write | claim read (index + body) | complete | retry | release | dead-letter | requeue | discard | renewal |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for payload in [1024, 100 * 1024, 400 * 1024] {
        let row = capacity_row(client, payload, 20).await;
        print_row(payload, "measured", &row);
        print_row(payload, "design minimum", &design_row(payload));
        rows.push(row);
    }
    println!(
        "\ndedup record: {:.1} write units",
        dedup_units(client).await
    );
    let (small, big) = (
        rows[0].claim_write + rows[0].complete,
        rows[1].claim_write + rows[1].complete,
    );
    println!(
        "\nclaim+complete write units: 1 KB {small:.1}, 100 KB {big:.1} (ratio {:.2}; target at most 1.5)",
        big / small
    );
    println!("\nwrite units per claim+complete (100 KB payload): {big:.1}");
    big
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(url) = std::env::var("OUTBOX_DYNAMODB_URL") else {
        eprintln!(
            "SKIPPED: dynamodb_bench: OUTBOX_DYNAMODB_URL is not set (run scripts/services.sh)"
        );
        return;
    };
    let quick = outbox_bench::quick();
    let scale = if quick { 1 } else { 10 };
    let client = client(&url);
    println!(
        "# outbox-dynamodb bench against {url}{}",
        if quick { " (--quick)" } else { "" }
    );
    let only = |flag: &str| std::env::args().any(|a| a == flag);
    // `--capacity` runs only the capacity table (quick, and meaningful in a debug build);
    // `--relays` only the relay table.
    let (capacity, relays) = (only("--capacity"), only("--relays"));
    let all = !capacity && !relays;
    if all {
        dedup_bench(&client, scale).await;
    }
    let four = if all || relays {
        Some(relay_bench(&client, 2_000 * scale).await)
    } else {
        None
    };
    let big = if all || capacity {
        Some(capacity_bench(&client).await)
    } else {
        None
    };
    println!("\n## the two lines to read first\n");
    if let Some(four) = four {
        println!("refused writes per message (4 relays): {four:.3}");
    }
    if let Some(big) = big {
        println!("write units per claim+complete (100 KB payload): {big:.1}");
    }
}
