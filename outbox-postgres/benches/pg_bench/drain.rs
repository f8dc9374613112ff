//! Scenario 2: drain throughput with a no-op publisher, against two references.
//!
//! For every batch size and relay count the same pre-loaded backlog is drained five
//! ways: by the library's [`Relay`]s as configured by default (pipelined: the next
//! claim goes out while a batch publishes, [`RelayConfig::pipeline_depth`]), on the
//! new path with pipelining off (the settle of batch N and the claim of batch N+1 in
//! one statement, [`OutboxStore::settle_and_claim`]) and on the old one (a complete,
//! then a claim: the trait's default, through [`OldPath`], pipelining off); by
//! `pgbench` running the library's own claim + complete statements (the ceiling); and
//! by pgmq's pure-Rust client (the peer). Each run starts from a truncated, freshly
//! loaded and vacuumed table.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{
    ClaimIds, ClaimRequest, ClaimedMessage, Failure, Lease, OutboxStore, Relay, RelayConfig,
    Renewed, Settled, StoreCapabilities, DEFAULT_PIPELINE_DEPTH,
};
use outbox_postgres::{Notify, PgOutbox, PgOutboxConfig};

use crate::harness::{
    fmt_ratio, json_num, median, noop_publisher, preload, qualified, ratio, vacuum, Env, Res, Table,
};
use crate::pgbench;
use crate::pgmq_peer::Peer;

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
    let repeats = env.mode.pick(3, 1);
    let with_pgbench = pgbench::available();
    let depth = library_depth();
    env.heading(
        "2. Drain throughput (no-op publisher)",
        &format!(
            "msgs/s to empty a pre-loaded table: library Relays (claim batch = publish batch, \
         1 publish call in flight; library = the default relay: pipeline depth {depth}, settle + \
         next claim in one statement planned per call; unpiped: the same with pipeline \
         depth 1; prepared: the default with the statement prepared; old path: complete, then \
         claim, depth 1) vs pgbench running the library's own claim + complete \
         SQL (-M prepared, clients = relays) vs pgmq::PGMQueue read_batch + delete_batch \
         (workers = relays, same batch); each figure is the median of {repeats} run(s), \
         the three systems taking turns"
        ),
    );

    let config = PgOutboxConfig::default()
        .with_schema(SCHEMA)
        .with_notify(Notify::Off);
    let admin = env.pool(2).await?;
    let outbox = PgOutbox::new(admin.clone(), config.clone())?;
    outbox.install().await?;
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
        "unpiped/s",
        "prepared/s",
        "old path/s",
        "lib/unpiped",
        "unpiped/old",
        "prep/old",
        "pgbench/s",
        "lib/pgbench",
        "pgmq/s",
        "lib/pgmq",
        "lib vs batch 1",
    ]);
    let mut rows = Vec::new();
    let mut batch_one = [f64::NAN; RELAYS.len()];
    for (batch, n) in plan {
        for (slot, relays) in RELAYS.into_iter().enumerate() {
            let mut runs = Runs::default();
            for _ in 0..repeats {
                runs.library.push(rate(
                    n,
                    library_drain(env, &outbox, batch, relays, n, RelayPath::New).await?,
                ));
                runs.unpiped.push(rate(
                    n,
                    library_drain(env, &outbox, batch, relays, n, RelayPath::Unpiped).await?,
                ));
                runs.prepared.push(rate(
                    n,
                    library_drain(env, &outbox, batch, relays, n, RelayPath::Prepared).await?,
                ));
                runs.old_path.push(rate(
                    n,
                    library_drain(env, &outbox, batch, relays, n, RelayPath::Old).await?,
                ));
                if let Some(script) = &script {
                    runs.pgbench
                        .push(pgbench_drain(env, &outbox, script, batch, relays, n).await?);
                }
                runs.pgmq
                    .push(rate(n, peer.drain(env, batch, relays, n).await?));
            }
            let library = median(&runs.library);
            let old_path = median(&runs.old_path);
            let unpiped = median(&runs.unpiped);
            let prepared = median(&runs.prepared);
            let ceiling = median(&runs.pgbench);
            let pgmq = median(&runs.pgmq);
            if batch == 1 {
                batch_one[slot] = library;
            }
            let vs_one = ratio(library, batch_one[slot]);
            table.row(vec![
                batch.to_string(),
                relays.to_string(),
                n.to_string(),
                format!("{library:.0}"),
                format!("{unpiped:.0}"),
                format!("{prepared:.0}"),
                format!("{old_path:.0}"),
                fmt_ratio(ratio(library, unpiped)),
                fmt_ratio(ratio(unpiped, old_path)),
                fmt_ratio(ratio(prepared, old_path)),
                if ceiling.is_finite() {
                    format!("{ceiling:.0}")
                } else {
                    "-".to_owned()
                },
                fmt_ratio(ratio(library, ceiling)),
                format!("{pgmq:.0}"),
                fmt_ratio(ratio(library, pgmq)),
                fmt_ratio(vs_one),
            ]);
            rows.push(serde_json::json!({
                "batch": batch,
                "relays": relays,
                "messages": n,
                "library_msgs_per_s": json_num(library),
                "library_old_path_msgs_per_s": json_num(old_path),
                "library_unpipelined_msgs_per_s": json_num(unpiped),
                "library_vs_unpipelined": json_num(ratio(library, unpiped)),
                "unpipelined_vs_old_path": json_num(ratio(unpiped, old_path)),
                "new_vs_old_path": json_num(ratio(library, old_path)),
                "library_prepared_msgs_per_s": json_num(prepared),
                "prepared_vs_old_path": json_num(ratio(prepared, old_path)),
                "pgbench_msgs_per_s": json_num(ceiling),
                "pgmq_msgs_per_s": json_num(pgmq),
                "library_vs_pgbench": json_num(ratio(library, ceiling)),
                "library_vs_pgmq": json_num(ratio(library, pgmq)),
                "library_vs_batch_1": json_num(vs_one),
                "runs": {
                    "library": runs.library,
                    "library_old_path": runs.old_path,
                    "library_unpipelined": runs.unpiped,
                    "library_prepared": runs.prepared,
                    "pgbench": runs.pgbench,
                    "pgmq": runs.pgmq,
                },
            }));
        }
    }
    table.print();
    println!(
        "targets (issue 13): lib/pgmq >= 1.30 at batch 10 and 100 with 1, 2, 4 relays; \
         lib/pgbench >= 0.95. pgbench runs the old path's SQL (claim, then complete): the \
         library's complete-and-claim statement is planned per call and longer than \
         pg_stat_activity keeps, so it is not captured for pgbench"
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

/// msgs/s of every repetition, per system.
#[derive(Debug, Default)]
struct Runs {
    library: Vec<f64>,
    unpiped: Vec<f64>,
    old_path: Vec<f64>,
    prepared: Vec<f64>,
    pgbench: Vec<f64>,
    pgmq: Vec<f64>,
}

/// Pre-load `n`, then drain with pgbench: `relays` clients, exactly enough rounds each.
async fn pgbench_drain(
    env: &Env,
    outbox: &PgOutbox,
    script: &Path,
    batch: usize,
    relays: u32,
    n: u64,
) -> Res<f64> {
    reset(outbox, n).await?;
    let per_client = n / (u64::try_from(batch)? * u64::from(relays));
    let run = pgbench::run(env, script, relays, per_client, batch).await?;
    ensure_empty(outbox, "pgbench").await?;
    Ok(run.tps * f64::from(u32::try_from(batch)?))
}

fn rate(n: u64, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
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

/// Which relay path a library drain takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RelayPath {
    /// The default relay: `settle_and_claim` as PostgreSQL implements it (one
    /// statement, planned per call), pipelined at the default depth.
    New,
    /// As `New` with pipelining off (depth 1).
    Unpiped,
    /// The same statement prepared
    /// (`PgOutboxConfig::with_prepared_complete_and_claim`).
    Prepared,
    /// The trait's default: complete, then claim; pipelining off.
    Old,
}

/// A [`PgOutbox`] without its `settle_and_claim`: the relay then completes and claims
/// in two statements, as before issue 13.
#[derive(Debug)]
struct OldPath(PgOutbox);

#[async_trait]
impl OutboxStore for OldPath {
    fn capabilities(&self) -> StoreCapabilities {
        self.0.capabilities()
    }
    async fn claim(&self, request: ClaimRequest) -> outbox_core::Result<Vec<ClaimedMessage>> {
        self.0.claim(request).await
    }
    async fn claim_ids(&self, request: &ClaimIds) -> outbox_core::Result<Vec<ClaimedMessage>> {
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
) -> Res<Duration> {
    reset(outbox, n).await?;
    let depth = match path {
        RelayPath::New | RelayPath::Prepared => library_depth(),
        RelayPath::Unpiped | RelayPath::Old => 1,
    };
    // A pipelined relay may have a claim and a settle on the wire for each batch.
    let pool = env.pool(relays * u32::try_from(depth)? + 1).await?;
    let config = outbox
        .config()
        .clone()
        .with_prepared_complete_and_claim(path == RelayPath::Prepared);
    let pg = PgOutbox::new(pool.clone(), config)?;
    let store: Arc<dyn OutboxStore> = match path {
        RelayPath::New | RelayPath::Unpiped | RelayPath::Prepared => Arc::new(pg),
        RelayPath::Old => Arc::new(OldPath(pg)),
    };
    let publisher = noop_publisher();
    let relays = (0..relays)
        .map(|i| {
            let config = RelayConfig::default()
                .name(format!("bench-{i}"))
                .batch_size(batch)
                .publish(batch, 1)
                .pipeline_depth(depth);
            Relay::new(store.clone(), publisher.clone(), config)
        })
        .collect::<Result<Vec<_>, _>>()?;
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
    for handle in handles {
        let report = handle.shutdown().await?;
        if report.retried + report.dead_lettered + report.leases_lost > 0 {
            return Err(format!("relay did not just dispatch: {report:?}").into());
        }
    }
    pool.close().await;
    ensure_empty(outbox, "the relays").await?;
    Ok(took)
}
