//! Scenario 5: drain a freshly bulk-loaded table that was never analyzed.
//!
//! Backlogs often arrive in bulk (a migration, a backfill, a relay outage) into a table
//! whose statistics are stale or missing (autovacuum off, or not run yet). Each run
//! drops and reinstalls the table, turns autovacuum off for it, loads `n` messages
//! with one `INSERT ... SELECT generate_series`, and, **without** `ANALYZE`, drains it
//! with the library's relays and a no-op publisher. A run that does not finish within
//! the time cap reports the rate it reached.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{OutboxStore, Relay, RelayConfig};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use sqlx::PgPool;

use crate::harness::{json_num, median, noop_publisher, qualified, Env, Res, Table};

const SCHEMA: &str = "obx_bench_cold";
const BATCH: usize = 100;
const RELAYS: [u32; 2] = [1, 4];

/// Run the scenario; returns its JSON results.
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    let n: u64 = env.mode.pick(100_000, 20_000);
    let cap = env
        .mode
        .pick(Duration::from_secs(120), Duration::from_secs(45));
    let repeats = env.mode.pick(3, 1);
    env.heading(
        "5. Drain of an un-analyzed bulk load",
        &format!(
            "msgs/s to empty a table bulk-loaded with {n} messages by INSERT ... SELECT and \
             never analyzed (autovacuum off for the table): library Relays, batch {BATCH}, \
             no-op publisher; median of {repeats} run(s); a run stops at {cap:?} and \
             reports the rate reached"
        ),
    );
    let admin = env.pool(2).await?;
    let config = PgOutboxConfig::default().with_schema(SCHEMA);
    let mut table = Table::new(&["relays", "msgs", "drained", "seconds", "msgs/s"]);
    let mut rows = Vec::new();
    for relays in RELAYS {
        let mut rates = Vec::new();
        let mut last = (0, Duration::ZERO);
        for _ in 0..repeats {
            let outbox = PgOutbox::new(admin.clone(), config.clone())?;
            bulk_load(&admin, &outbox, n).await?;
            let (drained, took) = drain(env, &outbox, relays, n, cap).await?;
            rates.push(drained as f64 / took.as_secs_f64());
            last = (drained, took);
        }
        let rate = median(&rates);
        table.row(vec![
            relays.to_string(),
            n.to_string(),
            last.0.to_string(),
            format!("{:.1}", last.1.as_secs_f64()),
            format!("{rate:.0}"),
        ]);
        rows.push(serde_json::json!({
            "relays": relays,
            "messages": n,
            "drained_last_run": last.0,
            "seconds_last_run": last.1.as_secs_f64(),
            "msgs_per_s": json_num(rate),
            "runs": rates,
        }));
    }
    table.print();
    println!("a drained count below msgs means the run hit the {cap:?} cap");
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{SCHEMA}\" CASCADE"))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(serde_json::json!({
        "description": "drain a bulk-loaded, never analyzed table",
        "batch": BATCH,
        "cap_seconds": cap.as_secs_f64(),
        "rows": rows,
    }))
}

/// A fresh table (no statistics, autovacuum off for it) holding `n` due messages.
async fn bulk_load(admin: &PgPool, outbox: &PgOutbox, n: u64) -> Res<()> {
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{SCHEMA}\" CASCADE"))
        .execute(admin)
        .await?;
    outbox.install().await?;
    let table = qualified(outbox);
    sqlx::query(&format!(
        "ALTER TABLE {table} SET (autovacuum_enabled = false)"
    ))
    .execute(admin)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO {table} (id, destination, payload, content_type, available_at) \
         SELECT gen_random_uuid(), 'orders.created', \
             convert_to('{{\"order_id\":' || g || ',\"note\":\"benchmark payload, roughly \
             the size of a small domain event\"}}', 'UTF8'), \
             'application/json', now() - interval '1 minute' \
         FROM generate_series(1, $1) AS g"
    ))
    .bind(i64::try_from(n)?)
    .execute(admin)
    .await?;
    let analyzed: bool = sqlx::query_scalar(
        "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL \
         FROM pg_stat_user_tables WHERE schemaname = $1",
    )
    .bind(SCHEMA)
    .fetch_one(admin)
    .await?;
    if analyzed {
        return Err("the bulk-loaded table was analyzed; the scenario needs it not to be".into());
    }
    Ok(())
}

/// Run `relays` relays until `n` are dispatched or `cap` passes; returns how many were
/// dispatched and how long it took.
async fn drain(
    env: &Env,
    outbox: &PgOutbox,
    relays: u32,
    n: u64,
    cap: Duration,
) -> Res<(u64, Duration)> {
    let pool = env.pool(relays + 1).await?;
    let store: Arc<dyn OutboxStore> =
        Arc::new(PgOutbox::new(pool.clone(), outbox.config().clone())?);
    let publisher = noop_publisher();
    let relays = (0..relays)
        .map(|i| {
            let config = RelayConfig::default()
                .with_name(format!("cold-{i}"))
                .with_batch_size(BATCH)
                .with_publish_batch_size(BATCH)
                .with_publish_concurrency(1);
            Relay::new(store.clone(), publisher.clone(), config)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    let handles: Vec<_> = relays.iter().map(Relay::spawn).collect();
    let dispatched = || relays.iter().map(|r| r.report().dispatched).sum::<u64>();
    while dispatched() < n && start.elapsed() < cap {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    let done = dispatched();
    for handle in handles {
        let report = handle.shutdown().await?;
        if report.retried + report.dead_lettered + report.leases_lost > 0 {
            return Err(format!("relay did not just dispatch: {report:?}").into());
        }
    }
    pool.close().await;
    Ok((done, took))
}
