//! Scenario 2: drain throughput with a no-op publisher, against two references.
//!
//! For every batch size and relay count the same pre-loaded backlog is drained six
//! ways: by the library's [`Relay`]s as configured by default (pipelined: the next
//! claim goes out while a batch publishes, [`RelayConfig::pipeline_depth`]), the same
//! with held-lock claims ([`ClaimMode::HeldLock`]), on the
//! new path with pipelining off (the settle of batch N and the claim of batch N+1 in
//! one statement, [`OutboxStore::settle_and_claim`]) and on the old one (a complete,
//! then a claim: the trait's default, through [`OldPath`], pipelining off); by
//! `pgbench` running the library's own claim + complete statements (the ceiling); and
//! by pgmq's pure-Rust client (the peer). Each run starts from a truncated, freshly
//! loaded and vacuumed table.
//!
//! `OUTBOX_BENCH_TRACE=1` prints a line per library drain: its rate, the relays' counts,
//! and what the server did meanwhile (the deltas of `pg_stat_bgwriter`, `pg_stat_wal`
//! and the outbox table's `pg_stat_user_tables` row), to find what a slow round had
//! that the others did not.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_bench::Figure;
use outbox_core::{
    relay::DEFAULT_PIPELINE_DEPTH, store::ClaimIds, store::ClaimRequest, store::Failure,
    store::Lease, store::Renewed, store::Settled, store::StoreCapabilities, ClaimMode, OutboxStore,
    Relay, RelayConfig,
};
use outbox_postgres::PgOutbox;

use crate::harness::{
    fmt_ratio, json_num, median, noop_publisher, preload, qualified, ratio, vacuum, Env, Res, Table,
};
use crate::pgmq_peer::Peer;
use crate::{cpu, pgbench};

const SCHEMA: &str = "obx_bench_drain";
const RELAYS: [u32; 3] = [1, 2, 4];
/// Longest one drain may take before the bench gives up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// Run the scenario; returns its JSON results.
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    // Backlog per batch size: a multiple of batch x 4 relays, so pgbench's `-t` drains
    // it exactly; sized for one to three seconds per run on a 2-core machine.
    let plan: [(usize, u64); 4] = env.mode.pick(
        [(1, 2_000), (10, 10_000), (100, 40_000), (1_000, 80_000)],
        [(1, 400), (10, 2_000), (100, 8_000), (1_000, 12_000)],
    );
    // `OUTBOX_BENCH_REPEATS` overrides the rounds (say 3 in quick mode, for spreads).
    let repeats = std::env::var("OUTBOX_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| env.mode.pick(3, 1));
    // `OUTBOX_BENCH_BATCHES` (say `100,1000`) keeps only those batch sizes.
    let only: Option<Vec<usize>> = std::env::var("OUTBOX_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|b| b.trim().parse().ok()).collect());
    let plan: Vec<(usize, u64)> = plan
        .into_iter()
        .filter(|(batch, _)| only.as_ref().is_none_or(|only| only.contains(batch)))
        .collect();
    let with_pgbench = pgbench::available();
    let depth = library_depth();
    env.heading(
        "2. Drain throughput (no-op publisher)",
        &format!(
            "msgs/s to empty a pre-loaded table: library Relays (claim batch = publish batch, \
         1 publish call in flight; library = the default relay: pipeline depth {depth}, settle + \
         next claim in one prepared statement on the relay's connections; held = the same \
         relay on a store with held-lock claims (rows locked in a transaction the settle \
         commits); unpiped: the same \
         with pipeline depth 1; old path: complete, then claim, depth 1) vs pgbench running the library's own claim + complete \
         SQL (-M prepared, clients = relays) vs pgmq::PGMQueue read_batch + delete_batch \
         (workers = relays, same batch); each figure is the median of {repeats} round(s), \
         the systems taking turns in every round (A B C A B C ...)"
        ),
    );

    let (admin, outbox, config) = crate::harness::installed_outbox(env, SCHEMA).await?;
    let script = if with_pgbench {
        let captured = pgbench::capture(env, config.clone()).await?;
        let path = pgbench::write_script(
            &env.out_dir,
            "pgbench_claim_complete.sql",
            &pgbench::script(&captured)?,
        )?;
        println!("pgbench script: {}", path.display());
        Some(path)
    } else {
        println!("pgbench not found on PATH: the ceiling column is skipped");
        None
    };
    let peer = Peer::setup(env).await?;

    let mut table = Table::new(&[
        "batch",
        "relays",
        "msgs",
        "library/s",
        "lib cpu us/msg",
        "held/s",
        "held cpu",
        "unpiped/s",
        "old path/s",
        "pgbench/s",
        "pgbench cpu",
        "pgmq/s",
        "pgmq cpu",
        "lib/pgbench",
        "lib/pgmq [min..max]",
        "held/pgmq [min..max]",
    ]);
    let mut rows = Vec::new();
    for (batch, n) in plan {
        for relays in RELAYS {
            let mut runs = Runs::default();
            for _ in 0..repeats {
                let (took, spent) =
                    library_drain(env, &outbox, batch, relays, n, RelayPath::New).await?;
                runs.library.push(Run::of(n, took, spent));
                let (took, spent) =
                    library_drain(env, &outbox, batch, relays, n, RelayPath::Held).await?;
                runs.held.push(Run::of(n, took, spent));
                let (took, spent) =
                    library_drain(env, &outbox, batch, relays, n, RelayPath::Unpiped).await?;
                runs.unpiped.push(Run::of(n, took, spent));
                let (took, spent) =
                    library_drain(env, &outbox, batch, relays, n, RelayPath::Old).await?;
                runs.old_path.push(Run::of(n, took, spent));
                if let Some(script) = &script {
                    runs.pgbench
                        .push(pgbench_drain(env, &outbox, script, batch, relays, n).await?);
                }
                let (took, spent) = peer.drain(env, batch, relays, n).await?;
                runs.pgmq.push(Run::of(n, took, spent));
            }
            let library = median_rate(&runs.library);
            let pgbench = median_rate(&runs.pgbench);
            let pgmq = median_rate(&runs.pgmq);
            // Each round's ratio, so the spread shows how much the machine moved.
            let vs_pgmq: Vec<f64> = runs
                .library
                .iter()
                .zip(&runs.pgmq)
                .map(|(l, p)| ratio(l.rate, p.rate))
                .collect();
            let held_vs_pgmq: Vec<f64> = runs
                .held
                .iter()
                .zip(&runs.pgmq)
                .map(|(l, p)| ratio(l.rate, p.rate))
                .collect();
            let vs_pgbench: Vec<f64> = runs
                .library
                .iter()
                .zip(&runs.pgbench)
                .map(|(l, p)| ratio(l.rate, p.rate))
                .collect();
            let spread = |r: &[f64]| {
                let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{} [{lo:.2}..{hi:.2}]", fmt_ratio(median(r)))
            };
            table.row(vec![
                batch.to_string(),
                relays.to_string(),
                n.to_string(),
                format!("{library:.0}"),
                cpu_cell(&runs.library),
                format!("{:.0}", median_rate(&runs.held)),
                cpu_cell(&runs.held),
                format!("{:.0}", median_rate(&runs.unpiped)),
                format!("{:.0}", median_rate(&runs.old_path)),
                if pgbench.is_finite() {
                    format!("{pgbench:.0}")
                } else {
                    "-".to_owned()
                },
                cpu_cell(&runs.pgbench),
                format!("{pgmq:.0}"),
                cpu_cell(&runs.pgmq),
                if vs_pgbench.is_empty() {
                    "-".to_owned()
                } else {
                    spread(&vs_pgbench)
                },
                spread(&vs_pgmq),
                spread(&held_vs_pgmq),
            ]);
            rows.push(serde_json::json!({
                "batch": batch,
                "relays": relays,
                "messages": n,
                "library_msgs_per_s": json_num(library),
                "library_held_lock_msgs_per_s": json_num(median_rate(&runs.held)),
                "held_lock_vs_pgmq": held_vs_pgmq,
                "library_unpipelined_msgs_per_s": json_num(median_rate(&runs.unpiped)),
                "library_old_path_msgs_per_s": json_num(median_rate(&runs.old_path)),
                "pgbench_msgs_per_s": json_num(pgbench),
                "pgmq_msgs_per_s": json_num(pgmq),
                "library_vs_pgbench": vs_pgbench,
                "library_vs_pgmq": vs_pgmq,
                "runs": {
                    "library": runs_json(&runs.library),
                    "library_held_lock": runs_json(&runs.held),
                    "library_unpipelined": runs_json(&runs.unpiped),
                    "library_old_path": runs_json(&runs.old_path),
                    "pgbench": runs_json(&runs.pgbench),
                    "pgmq": runs_json(&runs.pgmq),
                },
            }));
        }
    }
    table.print();
    println!(
        "cpu columns: microseconds of CPU per message, client (this process: relays or the \
         pgmq client; pgbench's own process for pgbench) + server (every postgres process), \
         medians. Targets: held/pgmq >= 1.3 at batch 10 and 100 with 1, 2 and 4 relays, \
         >= 1.2 at batch 1000; lib/pgmq >= 1.0 at batch 100 with 1 relay, >= 0.9 with 2 \
         and 4. pgbench runs the library's claim and complete statements (two per batch); \
         the relay sends one complete-and-claim; a held-lock relay sends BEGIN, the claim, \
         the batch's registry insert (another connection), the settle and COMMIT"
    );
    peer.teardown().await?;
    admin.close().await;
    Ok(serde_json::json!({
        "description": "drain a pre-loaded backlog with a no-op publisher",
        "relay_config": "batch_size = publish_batch_size = batch, publish_concurrency = 1, lease 30 s",
        "pgbench": "library claim statement wrapped in a CTE aggregating ids for \\gset; complete verbatim; -M prepared",
        "rows": rows,
    }))
}

/// One drain: msgs/s and CPU per message.
type Run = Figure;

/// The median msgs/s of some drains.
fn median_rate(runs: &[Run]) -> f64 {
    median(&runs.iter().map(|r| r.rate).collect::<Vec<_>>())
}

/// `client + server` µs per message, medians.
fn cpu_cell(runs: &[Run]) -> String {
    if runs.is_empty() {
        return "-".to_owned();
    }
    let client = median(&runs.iter().map(|r| r.client_us).collect::<Vec<_>>());
    let server = median(&runs.iter().map(|r| r.server_us).collect::<Vec<_>>());
    format!("{client:.1}+{server:.1}")
}

fn runs_json(runs: &[Run]) -> serde_json::Value {
    runs.iter()
        .map(|r| {
            serde_json::json!({
                "msgs_per_s": json_num(r.rate),
                "client_cpu_us_per_msg": json_num(r.client_us),
                "server_cpu_us_per_msg": json_num(r.server_us),
            })
        })
        .collect()
}

/// Every repetition, per system.
#[derive(Debug, Default)]
struct Runs {
    library: Vec<Run>,
    held: Vec<Run>,
    unpiped: Vec<Run>,
    old_path: Vec<Run>,
    pgbench: Vec<Run>,
    pgmq: Vec<Run>,
}

/// Pre-load `n`, then drain with pgbench: `relays` clients, exactly enough rounds each.
async fn pgbench_drain(
    env: &Env,
    outbox: &PgOutbox,
    script: &Path,
    batch: usize,
    relays: u32,
    n: u64,
) -> Res<Run> {
    reset(outbox, n).await?;
    let per_client = n / (u64::try_from(batch)? * u64::from(relays));
    let cpu = cpu::sample(outbox_testkit::cpu::Server::Postgres);
    let run = pgbench::run(env, script, relays, per_client, batch).await?;
    let (client_us, server_us) = cpu::since(cpu).per(n);
    ensure_empty(outbox, "pgbench").await?;
    Ok(Run {
        rate: run.tps * f64::from(u32::try_from(batch)?),
        client_us,
        server_us,
    })
}

/// Empty the table, enqueue `n` messages through the library, vacuum.
async fn reset(outbox: &PgOutbox, n: u64) -> Res<()> {
    let table = qualified(outbox);
    sqlx::query(&format!("TRUNCATE {table}"))
        .execute(outbox.pool())
        .await?;
    preload(outbox, n).await?;
    vacuum(outbox.pool(), &table).await
}

async fn ensure_empty(outbox: &PgOutbox, who: &str) -> Res<()> {
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", qualified(outbox)))
        .fetch_one(outbox.pool())
        .await?;
    if left != 0 {
        return Err(format!("{who} left {left} messages in the outbox").into());
    }
    Ok(())
}

/// Whether `OUTBOX_BENCH_TRACE=1` asks for a line per library drain.
fn tracing() -> bool {
    std::env::var("OUTBOX_BENCH_TRACE").is_ok_and(|v| v.trim() == "1")
}

/// The server's cumulative counters that could explain a slow drain: background writer
/// and checkpoints, WAL, and the outbox table's scans, tuples and (auto)vacuums.
async fn server_counters(outbox: &PgOutbox) -> Res<serde_json::Map<String, serde_json::Value>> {
    let table = qualified(outbox);
    let sql = format!(
        "SELECT json_build_object(\
         'bgw', (SELECT row_to_json(b) FROM pg_stat_bgwriter AS b), \
         'wal', (SELECT row_to_json(w) FROM pg_stat_wal AS w), \
         'tbl', (SELECT row_to_json(t) FROM pg_stat_user_tables AS t \
                 WHERE t.relid = '{table}'::regclass))::text"
    );
    let text: String = sqlx::query_scalar(&sql).fetch_one(outbox.pool()).await?;
    let mut flat = serde_json::Map::new();
    if let serde_json::Value::Object(groups) = serde_json::from_str(&text)? {
        for (group, fields) in groups {
            if let serde_json::Value::Object(fields) = fields {
                for (name, value) in fields {
                    flat.insert(format!("{group}.{name}"), value);
                }
            }
        }
    }
    Ok(flat)
}

/// `name=delta` for every numeric counter that moved, in name order.
fn counter_deltas(
    before: &serde_json::Map<String, serde_json::Value>,
    after: &serde_json::Map<String, serde_json::Value>,
) -> String {
    let mut moved: Vec<String> = after
        .iter()
        .filter_map(|(name, value)| {
            let delta = value.as_f64()? - before.get(name)?.as_f64()?;
            (delta != 0.0).then(|| format!("{name}={delta}"))
        })
        .collect();
    moved.sort();
    moved.join(" ")
}

/// Which relay path a library drain takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RelayPath {
    /// The default relay: `settle_and_claim` as PostgreSQL implements it (one
    /// prepared statement), pipelined at the default depth.
    New,
    /// As `New` on a store with held-lock claims.
    Held,
    /// As `New` with pipelining off (depth 1).
    Unpiped,
    /// The trait's default: complete, then claim; pipelining off.
    Old,
}

/// A [`PgOutbox`] without its `settle_and_claim`: the relay then completes and claims
/// in two statements, as it did before `settle_and_claim` existed.
#[derive(Debug)]
struct OldPath(PgOutbox);

#[async_trait]
impl OutboxStore for OldPath {
    fn capabilities(&self) -> StoreCapabilities {
        self.0.capabilities()
    }
    async fn claim(
        &self,
        request: ClaimRequest,
    ) -> outbox_core::Result<outbox_core::store::Claimed> {
        self.0.claim(request).await
    }
    async fn claim_ids(
        &self,
        request: &ClaimIds,
    ) -> outbox_core::Result<outbox_core::store::Claimed> {
        self.0.claim_ids(request).await
    }
    async fn complete(&self, leases: &[Lease]) -> outbox_core::Result<Settled> {
        self.0.complete(leases).await
    }
    async fn fail(&self, failures: &[Failure]) -> outbox_core::Result<Settled> {
        self.0.fail(failures).await
    }
    async fn release(&self, leases: &[Lease]) -> outbox_core::Result<Settled> {
        self.0.release(leases).await
    }
    async fn renew(&self, leases: &[Lease], lease: Duration) -> outbox_core::Result<Renewed> {
        self.0.renew(leases, lease).await
    }
}

/// The pipeline depth of the default relay: `OUTBOX_BENCH_PIPELINE_DEPTH` when set
/// (to compare depths), else the library's default.
fn library_depth() -> usize {
    std::env::var("OUTBOX_BENCH_PIPELINE_DEPTH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_PIPELINE_DEPTH)
}

/// Pre-load `n`, then run `relays` relays on one pool until all are dispatched.
async fn library_drain(
    env: &Env,
    outbox: &PgOutbox,
    batch: usize,
    relays: u32,
    n: u64,
    path: RelayPath,
) -> Res<(Duration, cpu::Spent)> {
    reset(outbox, n).await?;
    let depth = match path {
        RelayPath::New | RelayPath::Held => library_depth(),
        RelayPath::Unpiped | RelayPath::Old => 1,
    };
    // A pipelined relay may have a claim and a settle on the wire for each batch.
    let pool = env.pool(relays * u32::try_from(depth)? + 1).await?;
    let connections = relays * u32::try_from(depth)? + 1;
    let mut config = outbox.config().clone().with_relay_connections(connections);
    // Each relay holds up to `depth` batches and claims the next meanwhile.
    let held = relays * (u32::try_from(depth)? + 1);
    if path == RelayPath::Held {
        config = config
            .with_claim_mode(ClaimMode::HeldLock)
            .with_held_connections(held);
    }
    let pg = PgOutbox::new(pool.clone(), config)?;
    let relay_pool = pg.relay_pool().clone();
    let held_pool = pg.held_pool().map(|(pool, _)| pool.clone());
    let store: Arc<dyn OutboxStore> = match path {
        RelayPath::New | RelayPath::Held | RelayPath::Unpiped => Arc::new(pg),
        RelayPath::Old => Arc::new(OldPath(pg)),
    };
    let publisher = noop_publisher();
    let relays = (0..relays)
        .map(|i| {
            let config = RelayConfig::default()
                .with_name(format!("bench-{i}"))
                .with_batch_size(batch)
                .with_publish_batch_size(batch)
                .with_publish_concurrency(1)
                .with_pipeline_depth(depth);
            Relay::new(store.clone(), publisher.clone(), config)
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Open the relay connections before the clock starts, as pgmq's pool is.
    let warm: Vec<_> =
        futures::future::try_join_all((0..connections).map(|_| relay_pool.acquire())).await?;
    drop(warm);
    if let Some(held_pool) = &held_pool {
        let warm: Vec<_> =
            futures::future::try_join_all((0..held).map(|_| held_pool.acquire())).await?;
        drop(warm);
    }
    let before = match tracing() {
        true => Some(server_counters(outbox).await?),
        false => None,
    };
    let cpu = cpu::sample(outbox_testkit::cpu::Server::Postgres);
    let start = Instant::now();
    let handles: Vec<_> = relays.iter().map(Relay::spawn).collect();
    let dispatched = || relays.iter().map(|r| r.report().dispatched).sum::<u64>();
    while dispatched() < n {
        if start.elapsed() > DRAIN_TIMEOUT {
            return Err(format!(
                "relays dispatched {} of {n} in {DRAIN_TIMEOUT:?}",
                dispatched()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    let spent = cpu::since(cpu);
    let after = match before {
        Some(_) => Some(server_counters(outbox).await?),
        None => None,
    };
    let mut claimed = 0;
    for handle in handles {
        let report = handle.shutdown().await?;
        if report.retried + report.dead_lettered + report.leases_lost > 0 {
            return Err(format!("relay did not just dispatch: {report:?}").into());
        }
        claimed += report.claimed;
    }
    if let (Some(before), Some(after)) = (before, after) {
        println!(
            "trace {path:?} batch={batch} relays={} rate={:.0}/s claimed={claimed} {}",
            relays.len(),
            n as f64 / took.as_secs_f64(),
            counter_deltas(&before, &after)
        );
    }
    pool.close().await;
    relay_pool.close().await;
    if let Some(held_pool) = held_pool {
        held_pool.close().await;
    }
    ensure_empty(outbox, "the relays").await?;
    Ok((took, spent))
}
