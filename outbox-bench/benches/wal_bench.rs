//! The log-tailing relay against the polling relay and pgbench, in one run, on one
//! private PostgreSQL cluster with `wal_level = logical` (fsync off, as every private
//! cluster of the testkit):
//!
//! 1. **Drain**: a backlog of 100,000 messages (payload 100 bytes, committed 1,000 per
//!    transaction) published into a no-op publisher by the log-tailing relay, by the
//!    polling relay (`outbox-postgres`, 1 and 2 relays) and by `pgbench` running the
//!    minimal claim + delete statements (1 and 2 clients): the polling ceiling. Batches
//!    of 100 everywhere. The systems take turns, round after round; medians.
//! 2. **Enqueue**: transactions of one business `INSERT`, alone, with a log-tailing
//!    enqueue of one message (its own statement, `WalOutbox::enqueue`, or in the
//!    business statement, `WalOutbox::enqueue_with`), with an `outbox-postgres` row enqueue (the table-row
//!    variant's write), and with a `SELECT 1`: what any second statement costs, the
//!    floor for an enqueue that is not part of the business statement. 4 concurrent
//!    connections; rounds taking turns; three settings: fsync off and on with the
//!    log-tailing relay streaming, and fsync off with it stopped (the writer's own cost).
//! 3. **Latency**: one message per transaction at 1,000 transactions/s for 10 s; the
//!    time from the commit (the commit record's timestamp) to the publisher call.
//!
//! CPU per message: this process and every `postgres` process, from `/proc`.
//!
//! ```sh
//! cargo bench -p outbox-bench --bench wal_bench        # about two minutes
//! OUTBOX_BENCH_QUICK=1 cargo bench -p outbox-bench --bench wal_bench   # or -- --quick
//! OUTBOX_BENCH_ONLY=enqueue,latency cargo bench -p outbox-bench --bench wal_bench
//! ```
//!
//! `OUTBOX_BENCH_ONLY` runs the scenarios named (`drain`, `enqueue`, `latency`).
//!
//! The log-tailing relay into real brokers (NATS JetStream, RabbitMQ), against the
//! library's publisher alone and the raw clients, is measured by `broker_bench`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_bench::{median_by, ms, percentile, Counting, Figure, Res};
use outbox_core::{NewMessage, Relay, RelayConfig};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_postgres_wal::{
    ReplicationTarget, WalOutbox, WalOutboxConfig, WalRelay, WalRelayConfig,
};
use outbox_testkit::cpu::{self, Server};
use outbox_testkit::postgres::cluster::Cluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const BATCH: usize = 100;

#[derive(Clone, Copy)]
struct Plan {
    backlog: u64,
    rounds: usize,
    enqueue_txns: usize,
    /// Enqueue's runs are short and noisy: more of them than the drain's.
    enqueue_rounds: usize,
    latency_secs: u64,
}

fn main() -> Res<()> {
    let quick = outbox_bench::quick();
    let plan = if quick {
        Plan {
            backlog: 20_000,
            rounds: 1,
            enqueue_txns: 1_000,
            enqueue_rounds: 3,
            latency_secs: 3,
        }
    } else {
        Plan {
            backlog: 100_000,
            rounds: 3,
            enqueue_txns: 12_000,
            enqueue_rounds: 5,
            latency_secs: 10,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cluster = match Cluster::start_with(&[
        ("wal_level", "logical"),
        ("max_wal_senders", "10"),
        ("max_replication_slots", "10"),
        ("shared_buffers", "256MB"),
        ("autovacuum", "off"),
    ]) {
        Ok(c) => c,
        Err(why) => {
            println!("SKIPPED: wal_bench needs a private PostgreSQL cluster: {why}");
            return Ok(());
        }
    };
    runtime.block_on(run(&cluster, plan))
}

async fn run(cluster: &Cluster, plan: Plan) -> Res<()> {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&cluster.url())
        .await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await?;
    println!(
        "wal_bench: PostgreSQL {version}, private cluster (wal_level = logical, fsync off), \
         {} cores, backlog {}, batch {BATCH}, rounds {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        plan.backlog,
        plan.rounds
    );
    if outbox_bench::selected("drain") {
        drain(cluster, &pool, plan).await?;
    }
    if outbox_bench::selected("enqueue") {
        enqueue(cluster, &pool, plan).await?;
    }
    if outbox_bench::selected("latency") {
        latency(cluster, &pool, plan).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Drain

fn message(n: u64) -> NewMessage {
    NewMessage::builder("bench.events")
        .partition_key(format!("k{}", n % 64))
        .payload(vec![b'x'; 100])
        .build()
        .expect("a valid message")
}

async fn drain(cluster: &Cluster, pool: &PgPool, plan: Plan) -> Res<()> {
    let systems = [
        "log-tailing relay",
        "polling relay x1",
        "polling relay x2",
        "pgbench claim+delete x1",
        "pgbench claim+delete x2",
    ];
    let mut runs: Vec<Vec<Figure>> = vec![Vec::new(); systems.len()];
    let pgbench_ok = std::process::Command::new("pgbench")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    for round in 0..plan.rounds {
        for (i, system) in systems.iter().enumerate() {
            let run = match i {
                0 => drain_wal(cluster, pool, plan.backlog, round).await?,
                1 | 2 => drain_polling(pool, plan.backlog, u32::try_from(i).unwrap()).await?,
                _ if !pgbench_ok => continue,
                _ => {
                    drain_pgbench(cluster, pool, plan.backlog, u32::try_from(i - 2).unwrap())
                        .await?
                }
            };
            println!(
                "  round {} {system:<26} {:>9.0} msgs/s  client {:>6.2} µs/msg  server {:>6.2} µs/msg",
                round + 1,
                run.rate,
                run.client_us,
                run.server_us
            );
            runs[i].push(run);
        }
    }
    let meds: Vec<Option<Figure>> = runs.iter().map(|r| median_by(r, |r| r.rate)).collect();
    let wal = meds[0].expect("log-tailing runs");
    println!(
        "\n1. Drain of {} messages into a no-op publisher (medians of {}):\n",
        plan.backlog, plan.rounds
    );
    println!("| system | msgs/s | client CPU µs/msg | server CPU µs/msg | log-tailing / this |");
    println!("|---|---:|---:|---:|---:|");
    for (name, m) in systems.iter().zip(&meds) {
        if let Some(m) = m {
            println!(
                "| {name} | {:.0} | {:.2} | {:.2} | {:.2} |",
                m.rate,
                m.client_us,
                m.server_us,
                wal.rate / m.rate
            );
        } else {
            println!("| {name} | not run (no pgbench) | | | |");
        }
    }
    println!();
    Ok(())
}

/// A fresh slot, the backlog enqueued, then one relay until it published everything.
async fn drain_wal(cluster: &Cluster, pool: &PgPool, n: u64, round: usize) -> Res<Figure> {
    let name = format!("bench_drain_{round}");
    let outbox = wal_outbox(pool, &name).await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let messages: Vec<NewMessage> = chunk.iter().map(|&i| message(i)).collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await?;
    }
    let publisher = Arc::new(Counting::default());
    let before = cpu::sample(Server::Postgres);
    let start = Instant::now();
    let stop = CancellationToken::new();
    let relay = WalRelay::new(
        outbox.clone(),
        ReplicationTarget::from_url(&cluster.url())?,
        publisher.clone(),
        WalRelayConfig::default().with_batch_size(BATCH),
    )?;
    let task = tokio::spawn(relay.run(stop.clone()));
    publisher.wait_for(n, Duration::from_secs(300)).await?;
    let elapsed = start.elapsed();
    let spent = cpu::since(before);
    stop.cancel();
    task.await??;
    drop_slot(pool, &name).await?;
    Ok(Figure::of(n, elapsed, spent))
}

async fn wal_outbox(pool: &PgPool, name: &str) -> Res<WalOutbox> {
    let config = WalOutboxConfig::default()
        .with_slot(name)
        .with_publication(name)
        .with_prefix(name)
        .with_dead_letters(PgOutboxConfig::default().with_schema(name));
    let outbox = WalOutbox::new(pool.clone(), config)?;
    outbox.install().await?;
    Ok(outbox)
}

/// Drop a slot once the stopped relay's walsender let go of it (dropping an active
/// slot fails).
async fn drop_slot(pool: &PgPool, name: &str) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let active = "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots \
                  WHERE slot_name = $1";
    while sqlx::query_scalar::<_, bool>(active)
        .bind(name)
        .fetch_one(pool)
        .await?
    {
        if Instant::now() > deadline {
            return Err(format!("slot {name} stayed active after the relay stopped").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(name)
        .execute(pool)
        .await?;
    Ok(())
}

/// A fresh outbox table loaded with the backlog, vacuumed; `relays` relays until empty.
async fn load_table(pool: &PgPool, n: u64) -> Res<PgOutbox> {
    sqlx::raw_sql("DROP SCHEMA IF EXISTS bench_poll CASCADE")
        .execute(pool)
        .await?;
    let outbox = PgOutbox::new(
        pool.clone(),
        PgOutboxConfig::default().with_schema("bench_poll"),
    )?;
    outbox.install().await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let messages: Vec<NewMessage> = chunk.iter().map(|&i| message(i)).collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await?;
    }
    sqlx::raw_sql("VACUUM ANALYZE bench_poll.outbox_messages")
        .execute(pool)
        .await?;
    Ok(outbox)
}

async fn drain_polling(pool: &PgPool, n: u64, relays: u32) -> Res<Figure> {
    let outbox = load_table(pool, n).await?;
    let outbox = PgOutbox::new(
        pool.clone(),
        outbox.config().clone().with_relay_connections(4 * relays),
    )?;
    let publisher = Arc::new(Counting::default());
    let before = cpu::sample(Server::Postgres);
    let start = Instant::now();
    let mut handles = Vec::new();
    for r in 0..relays {
        let config = RelayConfig::default()
            .with_name(format!("poll{r}"))
            .with_batch_size(BATCH)
            .with_publish_batch_size(BATCH)
            .with_publish_concurrency(1);
        let relay = Relay::new(Arc::new(outbox.clone()), publisher.clone(), config)?;
        handles.push(relay.spawn());
    }
    publisher.wait_for(n, Duration::from_secs(300)).await?;
    let elapsed = start.elapsed();
    let spent = cpu::since(before);
    for h in handles {
        h.shutdown().await?;
    }
    outbox.relay_pool().close().await;
    Ok(Figure::of(n, elapsed, spent))
}

/// The minimal polling protocol: claim 100 due rows (`FOR UPDATE SKIP LOCKED`, a lease
/// stamped), then delete them by id; pgbench, prepared, `clients` clients.
async fn drain_pgbench(cluster: &Cluster, pool: &PgPool, n: u64, clients: u32) -> Res<Figure> {
    load_table(pool, n).await?;
    let script = "WITH c AS (SELECT id FROM bench_poll.outbox_messages \
         WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at <= now() \
         ORDER BY available_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED), \
         u AS (UPDATE bench_poll.outbox_messages m SET lease_token = gen_random_uuid(), \
         available_at = now() + interval '30 seconds' FROM c WHERE m.id = c.id RETURNING m.id) \
         SELECT array_agg(id)::text AS ids FROM u \\gset\n\
         DELETE FROM bench_poll.outbox_messages WHERE id = ANY(:ids::uuid[]);\n";
    let dir = std::env::temp_dir().join(format!("wal_bench_{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("claim_delete.sql");
    std::fs::write(&path, script)?;
    let per_client = n / (BATCH as u64) / u64::from(clients);
    let before = cpu::sample(Server::Postgres);
    let start = Instant::now();
    let out = tokio::process::Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            &clients.to_string(),
        ])
        .args(["-t", &per_client.to_string(), "-f"])
        .arg(&path)
        .arg(cluster.url())
        .output()
        .await?;
    let elapsed = start.elapsed();
    let spent = cpu::since(before);
    if !out.status.success() {
        return Err(format!("pgbench failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_poll.outbox_messages")
        .fetch_one(pool)
        .await?;
    if left != 0 {
        return Err(format!("pgbench left {left} rows").into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Figure::of(n, elapsed, spent))
}

// ---------------------------------------------------------------------------------
// Enqueue

async fn enqueue(cluster: &Cluster, pool: &PgPool, plan: Plan) -> Res<()> {
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_orders; \
         CREATE TABLE bench_orders (id uuid PRIMARY KEY, total bigint NOT NULL, note text)",
    )
    .execute(pool)
    .await?;
    let wal = wal_outbox(pool, "bench_enqueue").await?;
    sqlx::raw_sql("DROP SCHEMA IF EXISTS bench_rows CASCADE")
        .execute(pool)
        .await?;
    let rows = PgOutbox::new(
        pool.clone(),
        PgOutboxConfig::default().with_schema("bench_rows"),
    )?;
    rows.install().await?;
    // The log-tailing relay streams meanwhile, as in production, then stops: with it
    // stopped, the figures are the writer's own cost (the slot keeps the log, and no
    // walsender decodes it on these two cores), as the outbox row's enqueue is measured
    // without a polling relay claiming the rows.
    let publisher = Arc::new(Counting::default());
    let stop = CancellationToken::new();
    let relay = WalRelay::new(
        wal.clone(),
        ReplicationTarget::from_url(&cluster.url())?,
        publisher.clone(),
        WalRelayConfig::default(),
    )?;
    let task = tokio::spawn(relay.run(stop.clone()));
    // fsync is reloadable: the same cluster measures commits as the testkit runs them
    // (fsync off: a commit costs only CPU, so an extra statement weighs most) and as a
    // production server makes them (fsync on: the commit waits for the disk).
    for (fsync, streaming) in [("off", true), ("on", true), ("off", false)] {
        if !streaming {
            stop.cancel();
        }
        sqlx::query(&format!("ALTER SYSTEM SET fsync = {fsync}"))
            .execute(pool)
            .await?;
        sqlx::query("SELECT pg_reload_conf()").execute(pool).await?;
        let rates = enqueue_turns(pool, &wal, &rows, plan).await?;
        let relay = if streaming {
            "the relay streaming"
        } else {
            "the relay stopped"
        };
        print_enqueue(&rates, &format!("fsync {fsync}, {relay}"), plan);
    }
    sqlx::query("ALTER SYSTEM RESET fsync")
        .execute(pool)
        .await?;
    sqlx::query("SELECT pg_reload_conf()").execute(pool).await?;
    task.await??;
    drop_slot(pool, "bench_enqueue").await?;
    Ok(())
}

const ENQUEUE_KINDS: [&str; 5] = [
    "business insert alone",
    "+ log-tailing enqueue",
    "+ log-tailing enqueue_with",
    "+ outbox row enqueue",
    "+ SELECT 1 (the floor)",
];

/// Rounds of every kind of transaction, taking turns: one `Figure` per kind and round.
async fn enqueue_turns(
    pool: &PgPool,
    wal: &WalOutbox,
    rows: &PgOutbox,
    plan: Plan,
) -> Res<Vec<Vec<Figure>>> {
    let mut rates: Vec<Vec<Figure>> = vec![Vec::new(); ENQUEUE_KINDS.len()];
    for round in 0..plan.enqueue_rounds {
        for (k, kind) in ENQUEUE_KINDS.iter().enumerate() {
            let before = cpu::sample(Server::Postgres);
            let start = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let (pool, wal, rows) = (pool.clone(), wal.clone(), rows.clone());
                let per = plan.enqueue_txns / 4;
                tasks.push(tokio::spawn(async move {
                    for i in 0..per {
                        let mut tx = pool.begin().await?;
                        let id = uuid::Uuid::now_v7();
                        let total = i64::try_from(i).unwrap_or(0);
                        let order =
                            sqlx::query("INSERT INTO bench_orders (id, total) VALUES ($1, $2)")
                                .bind(id)
                                .bind(total);
                        if k == 2 {
                            // The business insert and the message in one statement.
                            wal.enqueue_with(&mut tx, order, &[message(i as u64)])
                                .await?;
                        } else {
                            order.execute(&mut *tx).await?;
                        }
                        match k {
                            1 => wal.enqueue(&mut tx, &[message(i as u64)]).await?,
                            3 => rows.enqueue(&mut tx, &[message(i as u64)]).await?,
                            // What any second statement costs: the round trip alone.
                            4 => {
                                sqlx::query("SELECT 1").execute(&mut *tx).await?;
                            }
                            _ => {}
                        }
                        tx.commit().await?;
                    }
                    Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            let elapsed = start.elapsed();
            let n = (plan.enqueue_txns / 4 * 4) as u64;
            let run = Figure::of(n, elapsed, cpu::since(before));
            println!(
                "  round {} {kind:<29} {:>8.0} txn/s  client {:>6.2} µs/txn  server {:>6.2} µs/txn",
                round + 1,
                run.rate,
                run.client_us,
                run.server_us
            );
            rates[k].push(run);
        }
    }
    Ok(rates)
}

fn print_enqueue(rates: &[Vec<Figure>], mode: &str, plan: Plan) {
    let med = |v: &[Figure]| median_by(v, |r| r.rate).expect("at least one round");
    // Each kind against the business insert of the same round (they ran back to back),
    // then the median: steadier than a ratio of medians on a machine whose speed drifts.
    let ratio = |r: &[Figure]| {
        let mut v: Vec<f64> = r
            .iter()
            .zip(&rates[0])
            .map(|(k, b)| k.rate / b.rate)
            .collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    println!(
        "\n2. Enqueue ({mode}): transactions of one business INSERT (+ one message), \
         4 connections, {} transactions per run, {} rounds, medians:\n",
        plan.enqueue_txns, plan.enqueue_rounds
    );
    println!(
        "| transaction | txn/s | vs business alone (same round; min-max) | client CPU µs/txn | server CPU µs/txn |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (kind, r) in ENQUEUE_KINDS.iter().zip(rates) {
        let m = med(r);
        let (ratio, low, high) = ratio(r);
        println!(
            "| {kind} | {:.0} | {ratio:.2} ({low:.2}-{high:.2}) | {:.2} | {:.2} |",
            m.rate, m.client_us, m.server_us
        );
    }
    println!();
}

// ---------------------------------------------------------------------------------
// Latency

async fn latency(cluster: &Cluster, pool: &PgPool, plan: Plan) -> Res<()> {
    let outbox = wal_outbox(pool, "bench_latency").await?;
    let publisher = Arc::new(Counting::with_latencies());
    let stop = CancellationToken::new();
    let relay = WalRelay::new(
        outbox.clone(),
        ReplicationTarget::from_url(&cluster.url())?,
        publisher.clone(),
        WalRelayConfig::default(),
    )?;
    let task = tokio::spawn(relay.run(stop.clone()));
    let n = plan.latency_secs * 1_000;
    let mut conn = pool.acquire().await?;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let before = cpu::sample(Server::Postgres);
    let start = Instant::now();
    for i in 0..n {
        tick.tick().await;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        outbox.enqueue(&mut tx, &[message(i)]).await?;
        tx.commit().await?;
    }
    let produced_in = start.elapsed();
    publisher.wait_for(n, Duration::from_secs(60)).await?;
    let spent = cpu::since(before);
    stop.cancel();
    task.await??;
    drop_slot(pool, "bench_latency").await?;
    let mut lat = publisher.latencies();
    lat.sort_unstable();
    // Percentile p (in thousandths): nearest rank, in milliseconds.
    let pct = |per_mille: usize| ms(percentile(&lat, per_mille));
    let (client, server) = spent.per(n);
    println!(
        "3. Commit-to-publish latency, log-tailing relay, one message per transaction at \
         {:.0} msgs/s for {:.1?}:\n",
        n as f64 / produced_in.as_secs_f64(),
        produced_in
    );
    println!(
        "| messages | p50 ms | p90 ms | p99 ms | max ms | client CPU µs/msg | server CPU µs/msg |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {:.2} | {:.2} | {:.2} | {:.2} | {client:.2} | {server:.2} |",
        pct(500),
        pct(900),
        pct(990),
        pct(1000)
    );
    println!(
        "\n(client and server CPU here include the producer's transactions; latency runs from the \
         commit record's timestamp, by the server's clock, to the publisher call, by this \
         process's, on one host)"
    );
    Ok(())
}
