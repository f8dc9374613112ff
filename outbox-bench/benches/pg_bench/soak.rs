//! Scenario 7: claim latency under churn, with autovacuum on at its defaults.
//!
//! The shared server runs with `autovacuum = off` (and a per-table
//! `autovacuum_enabled` cannot turn it on), so this scenario starts a private cluster
//! ([`outbox_testkit::postgres::cluster`]) with the server's autovacuum defaults, plus
//! `log_autovacuum_min_duration = 0` so every autovacuum is logged. Without the server
//! binaries it prints a skip line and returns `null`.
//!
//! Each setup gets a fresh default outbox table (`Retention::Delete`, unordered) in its
//! own `obx_bench_soak_*` schema of that cluster. A producer enqueues at a steady
//! offered rate (transactions of [`PER_TX`] messages paced by a tokio interval, waking
//! the drain loops in-process after each commit as `Relay::wakeup` would), and one or
//! two drain loops consume exactly as a relay's steady state does:
//! [`OutboxStore::settle_and_claim`] completing the previous batch and claiming the
//! next (batch [`BATCH`]), a plain claim when there is nothing to settle, a no-op
//! publish in between, and an idle wait (wake-up or [`POLL`]) after an empty claim.
//! Every call is timed. Every [`SAMPLE`] the bench records the calls' latencies, the
//! size of the due index and of the table, dead and live tuples, autovacuum and
//! autoanalyze counts, the due index's entries read, and the backlog.
//!
//! Setups differ in the table's storage parameters (`ALTER TABLE ... SET`) and, for the
//! last, in a server setting no table can override (`autovacuum_naptime`, set with
//! `ALTER SYSTEM` and reset afterwards).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{store::ClaimRequest, store::Lease, store::Settlement, OutboxStore};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::postgres::cluster::{Cluster, Unavailable};
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::harness::{
    fmt_ratio, json_num, ms, order_message, pool_at, qualified, ratio, Env, Percentiles, Res, Table,
};

/// Schema of each setup: this, then the setup's name.
const SCHEMA_PREFIX: &str = "obx_bench_soak_";
/// Offered rate, messages per second.
const RATE: u64 = 2_000;
/// Messages per enqueueing transaction.
const PER_TX: u64 = 10;
/// Claim batch, as a relay's `batch_size`.
const BATCH: usize = 100;
/// Lease of every claim (the relay's default).
const LEASE: Duration = Duration::from_secs(30);
/// A drain loop's wait after an empty claim when no wake-up comes (the relay's default
/// first poll interval).
const POLL: Duration = Duration::from_millis(100);
/// How often the bench samples the table.
const SAMPLE: Duration = Duration::from_secs(5);
/// Server settings of the private cluster, on top of its defaults (autovacuum on).
const CLUSTER_SETTINGS: [(&str, &str); 2] =
    [("autovacuum", "on"), ("log_autovacuum_min_duration", "0")];

/// The storage parameters recommended for an outbox table under churn (see the
/// README's operations section): vacuum after a fixed number of dead rows rather than a
/// fraction of the live rows (which a past backlog can leave large in the statistics),
/// and at full speed. No `fillfactor`: a claim sets `available_at`, a key of the due
/// index, so its update is never HOT whatever room a page has, and a complete deletes.
const RECOMMENDED: &[(&str, &str)] = &[
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "2000"),
    ("autovacuum_vacuum_cost_delay", "0"),
];

/// One configuration of the soak.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Short name, also the schema's suffix.
    name: &'static str,
    /// `ALTER TABLE ... SET (...)` storage parameters.
    table: &'static [(&'static str, &'static str)],
    /// `ALTER SYSTEM` settings for this run only.
    server: &'static [(&'static str, &'static str)],
    /// Drain loops.
    drains: usize,
}

/// The setups run, in order: full mode adds two drain loops and the server-level
/// naptime.
fn setups(env: &Env) -> Vec<Setup> {
    let defaults = Setup {
        name: "defaults",
        table: &[],
        server: &[],
        drains: 1,
    };
    let recommended = Setup {
        name: "recommended",
        table: RECOMMENDED,
        ..defaults
    };
    let mut all = vec![defaults, recommended];
    if env.mode == crate::harness::Mode::Full {
        all.push(Setup {
            name: "defaults_2_drains",
            drains: 2,
            ..defaults
        });
        all.push(Setup {
            name: "recommended_2_drains",
            drains: 2,
            ..recommended
        });
        all.push(Setup {
            name: "recommended_naptime_10s",
            server: &[("autovacuum_naptime", "10s")],
            ..recommended
        });
    }
    all
}

/// Run the scenario; returns its JSON results (`null` without a private cluster).
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    let duration = env
        .mode
        .pick(Duration::from_secs(240), Duration::from_secs(40));
    // The "first" and "last" stretch compared in the summary.
    let edge = env
        .mode
        .pick(Duration::from_secs(60), Duration::from_secs(10));
    let print_every = env
        .mode
        .pick(Duration::from_secs(30), Duration::from_secs(10));
    let cluster = match tokio::task::spawn_blocking(|| Cluster::start_with(&CLUSTER_SETTINGS))
        .await?
    {
        Ok(cluster) => cluster,
        Err(Unavailable(why)) => {
            println!();
            println!("== 7. Soak under churn == SKIPPED: cannot start a private PostgreSQL cluster: {why}");
            return Ok(serde_json::Value::Null);
        }
    };
    let options: PgConnectOptions = cluster.url().parse()?;
    let admin = pool_at(&options, 1).await?;
    let server = describe_server(&admin).await?;
    let setups = setups(env);
    println!();
    println!("== 7. Soak under churn (autovacuum on) ==");
    println!(
        "compared: claim-call latency (settle_and_claim / claim, batch {BATCH}) over {:?} \
         of steady enqueue ({RATE} msg/s offered as transactions of {PER_TX}) and drain, \
         sampled every {SAMPLE:?}; per setup: p99 of the first {edge:?} vs the last {edge:?}, \
         due index size, dead tuples, autovacuums. Setups: {}",
        duration,
        setups.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
    );
    println!(
        "machine:  nproc={} (client and server share them; the machine is shared and noisy)",
        env.nproc
    );
    println!("server:   {server}");
    println!("mode:     {}", env.mode.name());
    println!(
        "recommended table settings: {}",
        storage_parameters(RECOMMENDED)
    );

    let mut results = Vec::new();
    for setup in &setups {
        let run = soak(&cluster, &options, &admin, *setup, duration).await?;
        run.print(print_every, edge);
        results.push(run);
    }
    let mut table = Table::new(&[
        "setup",
        "drains",
        "msg/s",
        "calls",
        "p99 first ms",
        "p99 last ms",
        "last/first",
        "p99 all ms",
        "max ms",
        "due idx KB start/max/end",
        "table KB max",
        "dead max",
        "vacuums",
    ]);
    let mut json = Vec::new();
    for run in &results {
        let summary = run.summary(edge);
        table.row(vec![
            run.setup.name.to_owned(),
            run.setup.drains.to_string(),
            format!("{:.0}", run.achieved_rate()),
            summary.calls.to_string(),
            fmt_ms(summary.first.map(|p| p.p99)),
            fmt_ms(summary.last.map(|p| p.p99)),
            fmt_ratio(summary.ratio),
            fmt_ms(summary.all.map(|p| p.p99)),
            fmt_ms(summary.all.map(|p| p.max)),
            format!(
                "{}/{}/{}",
                summary.due_start / 1024,
                summary.due_max / 1024,
                summary.due_end / 1024
            ),
            (summary.table_max / 1024).to_string(),
            summary.dead_max.to_string(),
            summary.vacuums.to_string(),
        ]);
        json.push(run.json(edge, &summary));
    }
    println!();
    println!("soak summary (first/last = the first and last {edge:?}):");
    table.print();
    println!(
        "reading: flat means last/first near 1 and no per-interval p99 spikes between \
         vacuums; autovacuum visits a database at most once per autovacuum_naptime (a \
         server setting, 1 min by default), whatever the table's thresholds"
    );
    admin.close().await;
    drop(cluster);
    Ok(serde_json::json!({
        "description": "claim latency under steady enqueue + drain with autovacuum on (private cluster)",
        "server": server,
        "offered_msgs_per_s": RATE,
        "messages_per_transaction": PER_TX,
        "batch": BATCH,
        "lease_s": LEASE.as_secs(),
        "sample_s": SAMPLE.as_secs(),
        "seconds_per_setup": duration.as_secs(),
        "edge_s": edge.as_secs(),
        "recommended_table_settings": storage_parameters(RECOMMENDED),
        "setups": json,
    }))
}

/// Version and the autovacuum settings in force, as one line.
async fn describe_server(admin: &PgPool) -> Res<String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY($1) \
         ORDER BY name",
    )
    .bind(vec![
        "autovacuum",
        "autovacuum_naptime",
        "autovacuum_vacuum_cost_delay",
        "autovacuum_vacuum_cost_limit",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_threshold",
        "fsync",
        "server_version",
        "shared_buffers",
        "synchronous_commit",
    ])
    .fetch_all(admin)
    .await?;
    let settings: Vec<String> = rows.iter().map(|(n, v)| format!("{n}={v}")).collect();
    Ok(format!(
        "private cluster at 127.0.0.1 (initdb defaults plus fsync=off, \
         log_autovacuum_min_duration=0): {}",
        settings.join(", ")
    ))
}

/// `a = 1, b = 2`, as `ALTER TABLE ... SET (...)` takes them.
fn storage_parameters(settings: &[(&str, &str)]) -> String {
    settings
        .iter()
        .map(|(n, v)| format!("{n} = {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the drain loops and the producer share with the sampler.
#[derive(Debug, Default)]
struct Shared {
    /// Latencies of the calls since the last sample.
    window: Mutex<Vec<Duration>>,
    /// Messages claimed since the last sample.
    claimed: AtomicU64,
    /// Messages committed by the producer.
    produced: AtomicU64,
    /// Messages completed (applied) by the drain loops.
    completed: AtomicU64,
    /// Leases reported lost (none expected).
    lost: AtomicU64,
    stop: AtomicBool,
}

/// One sample: the calls of an interval and the table's state at its end.
#[derive(Debug)]
struct Sample {
    /// Since the setup's start.
    at: Duration,
    latencies: Vec<Duration>,
    claimed: u64,
    backlog: u64,
    stats: Stats,
}

/// The table's and its due index's figures from the statistics views.
#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    due_bytes: i64,
    table_bytes: i64,
    dead: i64,
    live: i64,
    autovacuums: i64,
    autoanalyzes: i64,
    /// Cumulative index entries returned by scans of the due index.
    due_read: i64,
    /// Cumulative buffer accesses (hits and reads) of the due index.
    due_blocks: i64,
    /// Cumulative scans of the due index.
    due_scans: i64,
}

impl Stats {
    async fn read(admin: &PgPool, table: &str, due_index: &str) -> Res<Stats> {
        let row: (i64, i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT pg_relation_size(i.indexrelid), pg_relation_size(s.relid), \
                    s.n_dead_tup, s.n_live_tup, s.autovacuum_count, s.autoanalyze_count, \
                    i.idx_tup_read, i.idx_scan, b.idx_blks_hit + b.idx_blks_read \
             FROM pg_stat_user_tables AS s \
             JOIN pg_stat_user_indexes AS i ON i.relid = s.relid AND i.indexrelname = $2 \
             JOIN pg_statio_user_indexes AS b ON b.indexrelid = i.indexrelid \
             WHERE s.relid = $1::regclass",
        )
        .bind(table)
        .bind(due_index)
        .fetch_one(admin)
        .await?;
        Ok(Stats {
            due_bytes: row.0,
            table_bytes: row.1,
            dead: row.2,
            live: row.3,
            autovacuums: row.4,
            autoanalyzes: row.5,
            due_read: row.6,
            due_scans: row.7,
            due_blocks: row.8,
        })
    }
}

/// One autovacuum of the table, from the server log.
#[derive(Debug, Default)]
struct Vacuum {
    tuples_removed: Option<u64>,
    elapsed_s: Option<f64>,
    due_pages: Option<u64>,
    due_pages_deleted: Option<u64>,
}

/// One setup's run.
#[derive(Debug)]
struct SoakRun {
    setup: Setup,
    duration: Duration,
    start: Stats,
    samples: Vec<Sample>,
    produced: u64,
    completed: u64,
    lost: u64,
    vacuums: Vec<Vacuum>,
}

/// Run one setup on a fresh table for `duration`.
async fn soak(
    cluster: &Cluster,
    options: &PgConnectOptions,
    admin: &PgPool,
    setup: Setup,
    duration: Duration,
) -> Res<SoakRun> {
    let schema = format!("{SCHEMA_PREFIX}{}", setup.name);
    let config = PgOutboxConfig::default().with_schema(&schema);
    let installer = PgOutbox::new(admin.clone(), config.clone())?;
    installer.install().await?;
    let table = qualified(&installer);
    if !setup.table.is_empty() {
        sqlx::query(&format!(
            "ALTER TABLE {table} SET ({})",
            storage_parameters(setup.table)
        ))
        .execute(admin)
        .await?;
    }
    for (name, value) in setup.server {
        sqlx::query(&format!("ALTER SYSTEM SET {name} = '{value}'"))
            .execute(admin)
            .await?;
    }
    if !setup.server.is_empty() {
        sqlx::query("SELECT pg_reload_conf()")
            .execute(admin)
            .await?;
    }
    let due_index = format!("{}_due", config.table());
    let start_stats = Stats::read(admin, &table, &due_index).await?;

    let shared = Arc::new(Shared::default());
    let wakeups: Vec<Arc<Notify>> = (0..setup.drains).map(|_| Arc::new(Notify::new())).collect();
    let producer = {
        let outbox = PgOutbox::new(pool_at(options, 1).await?, config.clone())?;
        tokio::spawn(produce(outbox, shared.clone(), wakeups.clone()))
    };
    let mut drains = Vec::new();
    for wakeup in &wakeups {
        let store = PgOutbox::new(pool_at(options, 1).await?, config.clone())?;
        drains.push(tokio::spawn(drain(store, shared.clone(), wakeup.clone())));
    }

    let started = Instant::now();
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE, SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while started.elapsed() < duration {
        tick.tick().await;
        let latencies = std::mem::take(&mut *lock(&shared.window));
        let claimed = shared.claimed.swap(0, Ordering::SeqCst);
        let backlog = shared
            .produced
            .load(Ordering::SeqCst)
            .saturating_sub(shared.completed.load(Ordering::SeqCst));
        let stats = Stats::read(admin, &table, &due_index).await?;
        samples.push(Sample {
            at: started.elapsed(),
            latencies,
            claimed,
            backlog,
            stats,
        });
        if producer.is_finished() || drains.iter().any(|d| d.is_finished()) {
            break;
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    for wakeup in &wakeups {
        wakeup.notify_one();
    }
    producer.await??;
    for drain in drains {
        drain.await??;
    }
    if !setup.server.is_empty() {
        for (name, _) in setup.server {
            sqlx::query(&format!("ALTER SYSTEM RESET {name}"))
                .execute(admin)
                .await?;
        }
        sqlx::query("SELECT pg_reload_conf()")
            .execute(admin)
            .await?;
    }
    let run = SoakRun {
        setup,
        duration: started.elapsed(),
        start: start_stats,
        samples,
        produced: shared.produced.load(Ordering::SeqCst),
        completed: shared.completed.load(Ordering::SeqCst),
        lost: shared.lost.load(Ordering::SeqCst),
        vacuums: vacuums_in_log(&cluster.server_log(), &schema, config.table()),
    };
    // The next setup starts on a quiet cluster: this table's churn is gone.
    sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(admin)
        .await?;
    Ok(run)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Enqueue [`PER_TX`] messages per transaction at [`RATE`] until told to stop; wake
/// every drain loop after each commit.
async fn produce(outbox: PgOutbox, shared: Arc<Shared>, wakeups: Vec<Arc<Notify>>) -> Res<()> {
    let period = Duration::from_micros(1_000_000 * PER_TX / RATE);
    let mut tick = tokio::time::interval(period);
    // A stall is not made up with a burst: the achieved rate is reported instead.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut next = 0_u64;
    while !shared.stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let batch = (next..next + PER_TX)
            .map(order_message)
            .collect::<outbox_core::Result<Vec<_>>>()?;
        next += PER_TX;
        let mut tx = outbox.pool().begin().await?;
        outbox.enqueue(&mut tx, &batch).await?;
        tx.commit().await?;
        shared.produced.fetch_add(PER_TX, Ordering::SeqCst);
        for wakeup in &wakeups {
            wakeup.notify_one();
        }
    }
    outbox.pool().close().await;
    Ok(())
}

/// A relay's steady state without the relay: settle the last batch and claim the next
/// in one call, publish nothing, time every call.
async fn drain(store: PgOutbox, shared: Arc<Shared>, wakeup: Arc<Notify>) -> Res<()> {
    let request = ClaimRequest::new(BATCH, LEASE)?;
    let mut carried: Vec<Lease> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let claimed = if carried.is_empty() {
            store.claim(request).await?
        } else {
            let done = store
                .settle_and_claim(
                    Settlement {
                        complete: &carried,
                        ..Settlement::default()
                    },
                    request,
                )
                .await?;
            shared
                .completed
                .fetch_add(u64::try_from(done.completed.applied)?, Ordering::SeqCst);
            shared
                .lost
                .fetch_add(u64::try_from(done.completed.lost.len())?, Ordering::SeqCst);
            done.claimed?
        };
        lock(&shared.window).push(started.elapsed());
        shared
            .claimed
            .fetch_add(u64::try_from(claimed.len())?, Ordering::SeqCst);
        carried = claimed.iter().map(|c| c.lease).collect();
        if carried.is_empty() {
            // Nothing due: wait for a commit's wake-up, or poll.
            let _ = tokio::time::timeout(POLL, wakeup.notified()).await;
        }
    }
    if !carried.is_empty() {
        let settled = store.complete(&carried).await?;
        shared
            .completed
            .fetch_add(u64::try_from(settled.applied)?, Ordering::SeqCst);
    }
    store.pool().close().await;
    Ok(())
}

/// The autovacuums of `schema.table` the server logged (`log_autovacuum_min_duration
/// = 0`): rows removed, time taken, and the due index's pages.
fn vacuums_in_log(log: &str, schema: &str, table: &str) -> Vec<Vacuum> {
    let head = format!("automatic vacuum of table \"postgres.{schema}.{table}\"");
    let due = format!("index \"{table}_due\": pages: ");
    let mut vacuums = Vec::new();
    let mut lines = log.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.contains(&head) {
            continue;
        }
        let mut vacuum = Vacuum::default();
        while let Some(detail) = lines.next_if(|l| l.starts_with('\t') || l.starts_with(' ')) {
            let detail = detail.trim();
            if let Some(rest) = detail.strip_prefix("tuples: ") {
                vacuum.tuples_removed = leading_number(rest);
            } else if let Some(rest) = detail.strip_prefix(&due) {
                // "30 in total, 25 newly deleted, 25 currently deleted, 0 reusable"
                vacuum.due_pages = leading_number(rest);
                vacuum.due_pages_deleted = rest.split(", ").nth(1).and_then(leading_number);
            } else if let Some(at) = detail.find("elapsed: ") {
                vacuum.elapsed_s = leading_number(&detail[at + "elapsed: ".len()..]);
            }
        }
        vacuums.push(vacuum);
    }
    vacuums
}

/// The number a string starts with.
fn leading_number<T: std::str::FromStr>(s: &str) -> Option<T> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s[..end].parse().ok()
}

fn fmt_ms(d: Option<Duration>) -> String {
    d.map_or("-".to_owned(), |d| format!("{:.2}", ms(d)))
}

/// A setup's figures over the whole run.
#[derive(Debug)]
struct Summary {
    calls: usize,
    all: Option<Percentiles>,
    first: Option<Percentiles>,
    last: Option<Percentiles>,
    /// p99 of the last stretch over p99 of the first.
    ratio: f64,
    due_start: i64,
    due_max: i64,
    due_end: i64,
    table_max: i64,
    dead_max: i64,
    vacuums: i64,
    analyzes: i64,
}

impl SoakRun {
    fn achieved_rate(&self) -> f64 {
        self.produced as f64 / self.duration.as_secs_f64()
    }

    /// Latencies of the samples `keep` accepts.
    fn latencies(&self, keep: impl Fn(&Sample) -> bool) -> Vec<Duration> {
        self.samples
            .iter()
            .filter(|s| keep(s))
            .flat_map(|s| s.latencies.iter().copied())
            .collect()
    }

    fn summary(&self, edge: Duration) -> Summary {
        let end = self.samples.last().map_or(Duration::ZERO, |s| s.at);
        let first = Percentiles::of(self.latencies(|s| s.at <= edge + SAMPLE / 2));
        let last = Percentiles::of(self.latencies(|s| s.at + edge > end + SAMPLE / 2));
        let all = Percentiles::of(self.latencies(|_| true));
        let stat = |f: fn(&Stats) -> i64| self.samples.iter().map(move |s| f(&s.stats));
        let last_stats = self.samples.last().map_or(self.start, |s| s.stats);
        Summary {
            calls: all.map_or(0, |p| p.count),
            all,
            first,
            last,
            ratio: match (first, last) {
                (Some(f), Some(l)) => ratio(ms(l.p99), ms(f.p99)),
                _ => f64::NAN,
            },
            due_start: self.samples.first().map_or(0, |s| s.stats.due_bytes),
            due_max: stat(|s| s.due_bytes).max().unwrap_or(0),
            due_end: last_stats.due_bytes,
            table_max: stat(|s| s.table_bytes).max().unwrap_or(0),
            dead_max: stat(|s| s.dead).max().unwrap_or(0),
            vacuums: last_stats.autovacuums - self.start.autovacuums,
            analyzes: last_stats.autoanalyzes - self.start.autoanalyzes,
        }
    }

    /// The time series, one row per `every`.
    fn print(&self, every: Duration, edge: Duration) {
        println!();
        println!(
            "-- soak setup {} ({} drain loop(s)); table settings: {}; server: {} --",
            self.setup.name,
            self.setup.drains,
            if self.setup.table.is_empty() {
                "defaults".to_owned()
            } else {
                storage_parameters(self.setup.table)
            },
            if self.setup.server.is_empty() {
                "as started".to_owned()
            } else {
                storage_parameters(self.setup.server)
            },
        );
        let mut table = Table::new(&[
            "elapsed s",
            "calls",
            "msgs",
            "p50 ms",
            "p99 ms",
            "max ms",
            "due idx KB",
            "due entries/scan",
            "due pages/scan",
            "table KB",
            "dead tup",
            "live tup",
            "backlog",
            "autovac",
        ]);
        let per_row = usize::try_from(every.as_secs() / SAMPLE.as_secs())
            .unwrap_or(1)
            .max(1);
        let mut before = self.start;
        for chunk in self.samples.chunks(per_row) {
            let Some(end) = chunk.last() else { continue };
            let latencies: Vec<Duration> = chunk
                .iter()
                .flat_map(|s| s.latencies.iter().copied())
                .collect();
            let p = Percentiles::of(latencies);
            let scans = end.stats.due_scans - before.due_scans;
            let read = end.stats.due_read - before.due_read;
            let blocks = end.stats.due_blocks - before.due_blocks;
            table.row(vec![
                format!("{:.0}", end.at.as_secs_f64()),
                p.map_or(0, |p| p.count).to_string(),
                chunk.iter().map(|s| s.claimed).sum::<u64>().to_string(),
                fmt_ms(p.map(|p| p.p50)),
                fmt_ms(p.map(|p| p.p99)),
                fmt_ms(p.map(|p| p.max)),
                (end.stats.due_bytes / 1024).to_string(),
                fmt_ratio(ratio(read as f64, scans as f64)),
                fmt_ratio(ratio(blocks as f64, scans as f64)),
                (end.stats.table_bytes / 1024).to_string(),
                end.stats.dead.to_string(),
                end.stats.live.to_string(),
                end.backlog.to_string(),
                (end.stats.autovacuums - self.start.autovacuums).to_string(),
            ]);
            before = end.stats;
        }
        table.print();
        let s = self.summary(edge);
        println!(
            "summary: {:.0} msg/s achieved of {RATE} offered ({} produced, {} completed, {} \
             leases lost); p99 first {edge:?} {} ms, last {edge:?} {} ms, ratio {}; due index \
             KB start/max/end {}/{}/{}; autovacuums {} (logged: {}, rows removed {}, \
             longest {} s), autoanalyzes {}",
            self.achieved_rate(),
            self.produced,
            self.completed,
            self.lost,
            fmt_ms(s.first.map(|p| p.p99)),
            fmt_ms(s.last.map(|p| p.p99)),
            fmt_ratio(s.ratio),
            s.due_start / 1024,
            s.due_max / 1024,
            s.due_end / 1024,
            s.vacuums,
            self.vacuums.len(),
            self.vacuums
                .iter()
                .filter_map(|v| v.tuples_removed)
                .sum::<u64>(),
            self.vacuums
                .iter()
                .filter_map(|v| v.elapsed_s)
                .fold(0.0_f64, f64::max),
            s.analyzes,
        );
    }

    fn json(&self, edge: Duration, s: &Summary) -> serde_json::Value {
        let mut before = self.start;
        let samples: Vec<serde_json::Value> = self
            .samples
            .iter()
            .map(|sample| {
                let p = Percentiles::of(sample.latencies.clone());
                let scans = sample.stats.due_scans - before.due_scans;
                let read = sample.stats.due_read - before.due_read;
                let blocks = sample.stats.due_blocks - before.due_blocks;
                before = sample.stats;
                serde_json::json!({
                    "elapsed_s": sample.at.as_secs_f64(),
                    "calls": p.map_or(0, |p| p.count),
                    "messages_claimed": sample.claimed,
                    "p50_ms": p.map(|p| ms(p.p50)),
                    "p99_ms": p.map(|p| ms(p.p99)),
                    "max_ms": p.map(|p| ms(p.max)),
                    "due_index_bytes": sample.stats.due_bytes,
                    "due_index_entries_per_scan": json_num(ratio(read as f64, scans as f64)),
                    "due_index_pages_per_scan": json_num(ratio(blocks as f64, scans as f64)),
                    "table_bytes": sample.stats.table_bytes,
                    "n_dead_tup": sample.stats.dead,
                    "n_live_tup": sample.stats.live,
                    "backlog": sample.backlog,
                    "autovacuum_count": sample.stats.autovacuums - self.start.autovacuums,
                    "autoanalyze_count": sample.stats.autoanalyzes - self.start.autoanalyzes,
                })
            })
            .collect();
        let vacuums: Vec<serde_json::Value> = self
            .vacuums
            .iter()
            .map(|v| {
                serde_json::json!({
                    "tuples_removed": v.tuples_removed,
                    "elapsed_s": v.elapsed_s,
                    "due_index_pages": v.due_pages,
                    "due_index_pages_newly_deleted": v.due_pages_deleted,
                })
            })
            .collect();
        let pair = |o: &[(&str, &str)]| {
            o.iter()
                .map(|(n, v)| ((*n).to_owned(), serde_json::json!(v)))
                .collect::<serde_json::Map<_, _>>()
        };
        serde_json::json!({
            "setup": self.setup.name,
            "drain_loops": self.setup.drains,
            "table_settings": pair(self.setup.table),
            "server_settings": pair(self.setup.server),
            "seconds": self.duration.as_secs_f64(),
            "produced": self.produced,
            "completed": self.completed,
            "leases_lost": self.lost,
            "achieved_msgs_per_s": json_num(self.achieved_rate()),
            "summary": {
                "calls": s.calls,
                "claim": s.all.map(|p| p.json()),
                "edge_s": edge.as_secs(),
                "first": s.first.map(|p| p.json()),
                "last": s.last.map(|p| p.json()),
                "p99_last_vs_first": json_num(s.ratio),
                "due_index_bytes_start": s.due_start,
                "due_index_bytes_max": s.due_max,
                "due_index_bytes_end": s.due_end,
                "table_bytes_max": s.table_max,
                "n_dead_tup_max": s.dead_max,
                "autovacuums": s.vacuums,
                "autoanalyzes": s.analyzes,
            },
            "autovacuums_logged": vacuums,
            "samples": samples,
        })
    }
}
