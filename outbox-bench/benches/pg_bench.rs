//! Benchmarks of the PostgreSQL outbox against a real server.
//!
//! ```text
//! cargo bench -p outbox-bench --bench pg_bench              # full: a few minutes + ~20 (soak)
//! cargo bench -p outbox-bench --bench pg_bench -- --quick   # about a minute + ~80 s (soak)
//! OUTBOX_BENCH_QUICK=1 cargo bench -p outbox-bench --bench pg_bench
//! OUTBOX_BENCH_ONLY=enqueue,cold_drain cargo bench -p outbox-bench --bench pg_bench
//! ```
//!
//! Scenarios, each printed as a table with what it compares, the machine and the mode:
//!
//! 1. **Enqueue overhead**: TPS of a business insert plus one outbox message in one
//!    transaction, against the business insert alone.
//! 2. **Drain throughput** with a no-op publisher, batch {1, 10, 100, 1000} x relays
//!    {1, 2, 4}, against `pgbench` running the library's own claim + complete SQL (the
//!    ceiling) and against pgmq's pure-Rust `PGMQueue` client (the peer).
//! 3. **Commit-to-publish latency** at 1,000 msg/s offered: NOTIFY wake-up vs polling.
//! 4. **Claim latency vs history**: 10^4 vs 10^6 dispatched rows kept (10^5 in quick
//!    mode).
//! 5. **Drain of an un-analyzed bulk load**: a table filled by one `INSERT ... SELECT`
//!    and never analyzed, drained by 1 and 4 relays (batch 100).
//! 6. **Enqueue cost**: the library's enqueue against `pgbench` sending the same
//!    statement, and the cost of each index of the table.
//! 7. **Soak under churn**: on a private cluster with autovacuum on at its defaults
//!    (`outbox_testkit::postgres::cluster`), steady enqueue (2,000 msg/s) and relay-like drain
//!    for 4 minutes per setup (40 s in quick mode), claim latency, due index size, dead
//!    tuples and autovacuums sampled every 5 s: table defaults against the recommended
//!    storage parameters (full mode adds 2 drain loops and `autovacuum_naptime = 10s`).
//!    About 20 minutes in full mode; skipped (`null`) without the server binaries.
//! 8. **Claim shapes** (`shapes`): the server's CPU and WAL per message of one claim +
//!    settle round by statement shape, driven by `pgbench` with no client library:
//!    pgmq's read + delete, the library's claim + complete, and a held-lock prototype
//!    (the claim's selection `FOR UPDATE SKIP LOCKED` in a transaction held until the
//!    delete commits).
//!
//! `OUTBOX_BENCH_ONLY` runs the scenarios named (`enqueue`, `drain`, `latency`,
//! `history`, `cold_drain`, `enqueue_cost`, `soak`, `shapes`), comma-separated; the
//! others are `null` in the results.
//!
//! The bench reports figures and ratios; it asserts none. Results also go to
//! `target/outbox-bench/results.json` (under `CARGO_TARGET_DIR` when set), next to
//! the generated pgbench script and the EXPLAIN output of the claim.
//!
//! Environment: `OUTBOX_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/outbox_bench`; the database is created when
//! missing). Every object lives in `obx_bench_*` schemas (and a `pgmq.*_obx_bench_drain`
//! queue), dropped at the end unless `OUTBOX_BENCH_KEEP=1`. `pgbench` must be on the
//! PATH for the ceiling column.

#[path = "pg_bench/cold_drain.rs"]
mod cold_drain;
#[path = "pg_bench/drain.rs"]
mod drain;
#[path = "pg_bench/enqueue.rs"]
mod enqueue;
#[path = "pg_bench/enqueue_cost.rs"]
mod enqueue_cost;
#[path = "pg_bench/harness.rs"]
mod harness;
#[path = "pg_bench/history.rs"]
mod history;
#[path = "pg_bench/latency.rs"]
mod latency;
#[path = "pg_bench/pgbench.rs"]
mod pgbench;
#[path = "pg_bench/pgmq_peer.rs"]
mod pgmq_peer;
#[path = "pg_bench/shapes.rs"]
mod shapes;
#[path = "pg_bench/soak.rs"]
mod soak;

use outbox_testkit::cpu;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use harness::{drop_bench_schemas, Env, Mode, Res};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/outbox_bench";

fn main() -> ExitCode {
    let quick = outbox_bench::quick();
    // `cargo test --benches` should not spend minutes here.
    if !quick && !outbox_bench::started_by_cargo_bench() {
        println!(
            "pg_bench: not started by `cargo bench`; skipping. Run \
             `cargo bench -p outbox-bench --bench pg_bench [-- --quick]`."
        );
        return ExitCode::SUCCESS;
    }
    let mode = if quick { Mode::Quick } else { Mode::Full };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pg_bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pg_bench failed: {e}");
            let mut source = e.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(mode: Mode) -> Res<()> {
    let url = std::env::var("OUTBOX_PG_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    let out_dir = target_dir().join("outbox-bench");
    let env = Env::connect(mode, url, out_dir).await?;
    let admin = env.pool(1).await?;
    drop_bench_schemas(&admin).await?;
    let started = Instant::now();
    println!("pg_bench ({} mode): {}", mode.name(), env.machine);

    let outcome = scenarios(&env).await;
    if std::env::var("OUTBOX_BENCH_KEEP").is_ok_and(|v| v.trim() == "1") {
        println!("OUTBOX_BENCH_KEEP=1: leaving the obx_bench_* schemas in place");
    } else {
        drop_bench_schemas(&admin).await?;
    }
    admin.close().await;
    let results = outcome?;

    let options = &env.options;
    let report = serde_json::json!({
        "mode": mode.name(),
        "machine": env.machine,
        "nproc": env.nproc,
        "server": format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        ),
        "finished_at": chrono::Utc::now().to_rfc3339(),
        "total_seconds": started.elapsed().as_secs_f64(),
        "enqueue_overhead": results[0],
        "drain_throughput": results[1],
        "commit_to_publish_latency": results[2],
        "claim_latency_vs_history": results[3],
        "drain_unanalyzed": results[4],
        "enqueue_cost": results[5],
        "soak": results[6],
        "claim_shapes": results[7],
    });
    let path = env.out_dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!();
    println!(
        "results: {} ({:.0?} in total)",
        path.display(),
        started.elapsed()
    );
    Ok(())
}

async fn scenarios(env: &Env) -> Res<[serde_json::Value; 8]> {
    let wanted = outbox_bench::selected;
    let skip = || serde_json::Value::Null;
    Ok([
        if wanted("enqueue") {
            enqueue::run(env).await?
        } else {
            skip()
        },
        if wanted("drain") {
            drain::run(env).await?
        } else {
            skip()
        },
        if wanted("latency") {
            latency::run(env).await?
        } else {
            skip()
        },
        if wanted("history") {
            history::run(env).await?
        } else {
            skip()
        },
        if wanted("cold_drain") {
            cold_drain::run(env).await?
        } else {
            skip()
        },
        if wanted("enqueue_cost") {
            enqueue_cost::run(env).await?
        } else {
            skip()
        },
        if wanted("soak") {
            soak::run(env).await?
        } else {
            skip()
        },
        if wanted("shapes") {
            shapes::run(env).await?
        } else {
            skip()
        },
    ])
}

/// `CARGO_TARGET_DIR` when set, else the workspace's `target/`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("target"), |root| root.join("target")),
    }
}
