//! Scenario 1: what enqueueing one message adds to a business transaction.
//!
//! Each client holds one connection and loops `BEGIN; INSERT order; [enqueue 1
//! message]; COMMIT` for a fixed time. The three variants run interleaved (round robin,
//! same clients, same phase length) so drift on a shared machine hits them alike.

use std::time::{Duration, Instant};

use outbox_postgres::{Notify, PgOutbox, PgOutboxConfig};
use sqlx::{Connection, PgConnection, PgPool};

use crate::harness::{fmt_ratio, json_num, median, order_message, ratio, Env, Res, Table};

const SCHEMA: &str = "obx_bench_enqueue";

/// One variant of the transaction.
#[derive(Debug, Clone)]
struct Variant {
    name: &'static str,
    outbox: Option<PgOutbox>,
}

/// Run the scenario; returns its JSON results.
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    let clients_list: [u32; 2] = [1, 8];
    let phase = env
        .mode
        .pick(Duration::from_secs(2), Duration::from_millis(1_500));
    let rounds = env.mode.pick(5_u32, 1);
    env.heading(
        "1. Enqueue overhead",
        &format!(
            "TPS of (INSERT order + PgOutbox::enqueue of 1 message) vs (INSERT order alone), \
             one transaction each, same clients; median of {rounds} round(s) of {phase:?} per \
             variant, variants taking turns, after a warm-up; outbox with NOTIFY off (the \
             default) and on (notify_on_commit)"
        ),
    );

    let setup = env.pool(2).await?;
    let variants = install(&setup).await?;

    let mut table = Table::new(&["clients", "variant", "tx/s", "vs business-only", "target"]);
    let mut results = Vec::new();
    for clients in clients_list {
        let pool = env.pool(clients).await?;
        phase_run(&pool, clients, &variants[0], phase / 2).await?; // warm-up
        let mut per_round = vec![Vec::new(); variants.len()];
        for _ in 0..rounds {
            for (variant, tps) in variants.iter().zip(per_round.iter_mut()) {
                let (count, took) = phase_run(&pool, clients, variant, phase).await?;
                tps.push(count as f64 / took.as_secs_f64());
            }
        }
        pool.close().await;
        let tps: Vec<f64> = per_round.iter().map(|r| median(r)).collect();
        for (i, variant) in variants.iter().enumerate() {
            let r = ratio(tps[i], tps[0]);
            let target = if variant.outbox.is_some() {
                ">= 0.90"
            } else {
                ""
            };
            table.row(vec![
                clients.to_string(),
                variant.name.to_owned(),
                format!("{:.0}", tps[i]),
                fmt_ratio(r),
                target.to_owned(),
            ]);
            results.push(serde_json::json!({
                "clients": clients,
                "variant": variant.name,
                "tps_median": json_num(tps[i]),
                "tps_per_round": per_round[i],
                "ratio_vs_business_only": json_num(r),
            }));
        }
    }
    table.print();
    setup.close().await;
    Ok(serde_json::json!({
        "description": "business insert + 1 outbox row vs business insert alone, one transaction each",
        "phase_seconds": phase.as_secs_f64(),
        "rounds": rounds,
        "rows": results,
    }))
}

/// Create the business table and two outboxes (NOTIFY on and off).
async fn install(pool: &PgPool) -> Res<Vec<Variant>> {
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA IF NOT EXISTS \"{SCHEMA}\";
         CREATE TABLE IF NOT EXISTS \"{SCHEMA}\".orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             customer text NOT NULL,
             amount_cents bigint NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now());"
    ))
    .execute(pool)
    .await?;
    let notify = PgOutbox::new(
        pool.clone(),
        PgOutboxConfig::default()
            .with_schema(SCHEMA)
            .with_table("outbox_notify")
            .with_notify(Notify::OnCommit),
    )?;
    let quiet = PgOutbox::new(
        pool.clone(),
        PgOutboxConfig::default()
            .with_schema(SCHEMA)
            .with_table("outbox_quiet")
            .with_notify(Notify::Off),
    )?;
    notify.install().await?;
    quiet.install().await?;
    Ok(vec![
        Variant {
            name: "business only",
            outbox: None,
        },
        Variant {
            name: "+ outbox (NOTIFY)",
            outbox: Some(notify),
        },
        Variant {
            name: "+ outbox (no NOTIFY)",
            outbox: Some(quiet),
        },
    ])
}

/// `clients` tasks loop transactions for `length`; returns commits and elapsed time.
async fn phase_run(
    pool: &PgPool,
    clients: u32,
    variant: &Variant,
    length: Duration,
) -> Res<(u64, Duration)> {
    let start = Instant::now();
    let deadline = start + length;
    let mut tasks = Vec::new();
    for client in 0..clients {
        let pool = pool.clone();
        let outbox = variant.outbox.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut done = 0_u64;
            while Instant::now() < deadline {
                let seq = u64::from(client) * 1_000_000_000 + done;
                one_transaction(&mut conn, outbox.as_ref(), seq).await?;
                done += 1;
            }
            Res::Ok(done)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok((total, start.elapsed()))
}

async fn one_transaction(conn: &mut PgConnection, outbox: Option<&PgOutbox>, seq: u64) -> Res<()> {
    let mut tx = conn.begin().await?;
    sqlx::query(&format!(
        "INSERT INTO \"{SCHEMA}\".orders (customer, amount_cents) VALUES ($1, $2)"
    ))
    .bind(format!("customer-{:06}", seq % 100_000))
    .bind(i64::try_from(1_000 + seq % 9_000)?)
    .execute(&mut *tx)
    .await?;
    if let Some(outbox) = outbox {
        outbox.enqueue(&mut tx, &[order_message(seq)?]).await?;
    }
    tx.commit().await?;
    Ok(())
}
