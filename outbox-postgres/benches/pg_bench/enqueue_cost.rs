//! Scenario 6: what an enqueue costs, against `pgbench` running the same statement,
//! and what each index of the outbox table adds to it.
//!
//! Every client loops `BEGIN; enqueue 1 keyed message; COMMIT` on a connection of its
//! own for a fixed phase. The library's enqueue is compared with `pgbench` sending the
//! statement the library prepared (read back from `pg_prepared_statements`) inside the
//! same `BEGIN` / `COMMIT`, and with the library enqueueing into copies of the table
//! each missing one index (the primary key stays: the enqueue's `ON CONFLICT (id)`
//! needs it). Variants take turns so drift on a shared machine hits them alike.

use std::time::{Duration, Instant};

use outbox_core::NewMessage;
use outbox_postgres::{Notify, PgOutbox, PgOutboxConfig};
use sqlx::{Connection, PgPool};

use crate::harness::{fmt_ratio, json_num, median, order_json, ratio, Env, Res, Table};
use crate::pgbench;

const SCHEMA: &str = "obx_bench_enqueue_cost";

/// A table variant: the index it lacks, if any.
struct Variant {
    name: &'static str,
    dropped: Option<&'static str>,
    outbox: PgOutbox,
}

/// Run the scenario; returns its JSON results.
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    let phase = env
        .mode
        .pick(Duration::from_secs(3), Duration::from_millis(1_500));
    let rounds = env.mode.pick(3_u32, 1);
    let clients_list: [u32; 2] = [1, 4];
    env.heading(
        "6. Enqueue cost and index costs",
        &format!(
            "tx/s of BEGIN; PgOutbox::enqueue(1 keyed message); COMMIT: the library vs pgbench \
             sending the library's prepared enqueue statement in the same transaction (-M \
             prepared), and the library on copies of the table each missing one index; median \
             of {rounds} round(s) of {phase:?}, variants taking turns"
        ),
    );
    let setup = env.pool(2).await?;
    let variants = install(&setup).await?;
    let script = if pgbench::available() {
        let statement = capture_enqueue(env, &variants[0].outbox).await?;
        Some(pgbench::write_script(
            &env.out_dir,
            "pgbench_enqueue.sql",
            &enqueue_script(&statement)?,
        )?)
    } else {
        println!("pgbench not found on PATH: the pgbench column is skipped");
        None
    };

    let mut table = Table::new(&["clients", "variant", "tx/s", "vs full table", "lib/pgbench"]);
    let mut rows = Vec::new();
    for clients in clients_list {
        let pool = env.pool(clients).await?;
        phase_run(&pool, clients, &variants[0].outbox, phase / 2).await?; // warm-up
        let mut library: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        let mut pgbench_tps = Vec::new();
        for _ in 0..rounds {
            for (variant, tps) in variants.iter().zip(library.iter_mut()) {
                let (count, took) = phase_run(&pool, clients, &variant.outbox, phase).await?;
                tps.push(count as f64 / took.as_secs_f64());
            }
            if let Some(script) = &script {
                pgbench_tps.push(pgbench::run_for(env, script, clients, phase).await?.tps);
            }
        }
        pool.close().await;
        let full = median(&library[0]);
        let ceiling = median(&pgbench_tps);
        for (variant, tps) in variants.iter().zip(&library) {
            let tps = median(tps);
            table.row(vec![
                clients.to_string(),
                variant.name.to_owned(),
                format!("{tps:.0}"),
                fmt_ratio(ratio(tps, full)),
                if variant.dropped.is_none() {
                    fmt_ratio(ratio(tps, ceiling))
                } else {
                    String::new()
                },
            ]);
            rows.push(serde_json::json!({
                "clients": clients,
                "variant": variant.name,
                "dropped_index": variant.dropped,
                "tps_median": json_num(tps),
                "vs_full_table": json_num(ratio(tps, full)),
            }));
        }
        table.row(vec![
            clients.to_string(),
            "pgbench, same statement".to_owned(),
            format!("{ceiling:.0}"),
            fmt_ratio(ratio(ceiling, full)),
            String::new(),
        ]);
        rows.push(serde_json::json!({
            "clients": clients,
            "variant": "pgbench",
            "tps_median": json_num(ceiling),
            "library_vs_pgbench": json_num(ratio(full, ceiling)),
        }));
    }
    table.print();
    println!("target (issue 13): library enqueue >= 0.95 of pgbench running the same statement");
    setup.close().await;
    Ok(serde_json::json!({
        "description": "BEGIN; enqueue 1 keyed message; COMMIT: library vs pgbench, and per-index cost",
        "phase_seconds": phase.as_secs_f64(),
        "rounds": rounds,
        "rows": rows,
    }))
}

/// The full table and one copy per index dropped.
async fn install(pool: &PgPool) -> Res<Vec<Variant>> {
    let mut variants = Vec::new();
    for (name, table, dropped) in [
        ("full table", "outbox_full", None),
        ("without _due", "outbox_no_due", Some("due")),
        ("without _key", "outbox_no_key", Some("key")),
        (
            "without _dispatched",
            "outbox_no_dispatched",
            Some("dispatched"),
        ),
        ("without _dead", "outbox_no_dead", Some("dead")),
    ] {
        let outbox = PgOutbox::new(
            pool.clone(),
            PgOutboxConfig::default()
                .with_schema(SCHEMA)
                .with_table(table)
                .with_notify(Notify::Off),
        )?;
        outbox.install().await?;
        if let Some(index) = dropped {
            sqlx::query(&format!("DROP INDEX \"{SCHEMA}\".\"{table}_{index}\""))
                .execute(pool)
                .await?;
        }
        variants.push(Variant {
            name,
            dropped,
            outbox,
        });
    }
    Ok(variants)
}

fn keyed_message(i: u64) -> Res<NewMessage> {
    Ok(NewMessage::builder("orders.created")
        .partition_key(format!("customer-{:06}", i % 100_000))
        .content_type("application/json")
        .payload(serde_json::to_vec(&order_json(i))?)
        .build()?)
}

/// `clients` tasks loop enqueue transactions for `length`; commits and elapsed time.
async fn phase_run(
    pool: &PgPool,
    clients: u32,
    outbox: &PgOutbox,
    length: Duration,
) -> Res<(u64, Duration)> {
    let start = Instant::now();
    let deadline = start + length;
    let mut tasks = Vec::new();
    for client in 0..clients {
        let pool = pool.clone();
        let outbox = outbox.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut done = 0_u64;
            while Instant::now() < deadline {
                let message = keyed_message(u64::from(client) * 1_000_000_000 + done)?;
                let mut tx = conn.begin().await?;
                outbox.enqueue(&mut tx, &[message]).await?;
                tx.commit().await?;
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

/// The enqueue statement the library prepared, captured on a connection of its own by
/// enqueueing one message in a transaction rolled back.
async fn capture_enqueue(env: &Env, outbox: &PgOutbox) -> Res<String> {
    let pool = env.pool(1).await?;
    let twin = PgOutbox::new(pool.clone(), outbox.config().clone())?;
    let mut tx = pool.begin().await?;
    twin.enqueue(&mut tx, &[keyed_message(0)?]).await?;
    tx.rollback().await?;
    let statements: Vec<String> =
        sqlx::query_scalar("SELECT statement FROM pg_prepared_statements")
            .fetch_all(&pool)
            .await?;
    pool.close().await;
    statements
        .into_iter()
        .find(|s| s.contains("ON CONFLICT (id) DO NOTHING"))
        .ok_or_else(|| "the library's enqueue statement was not prepared".into())
}

/// `BEGIN; <the enqueue of one keyed message>; COMMIT;` with the message's values
/// written as literals and a fresh id per transaction.
fn enqueue_script(statement: &str) -> Res<String> {
    let payload: String = serde_json::to_vec(&order_json(1))?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let values = [
        "ARRAY[gen_random_uuid()]".to_owned(),
        "ARRAY['orders.created']".to_owned(),
        "ARRAY['customer-' || lpad((random() * 99999)::int::text, 6, '0')]".to_owned(),
        format!("ARRAY['\\x{payload}'::bytea]"),
        "ARRAY['application/json']".to_owned(),
        "ARRAY['{}'::jsonb]".to_owned(),
        "ARRAY[0::bigint]".to_owned(),
    ];
    let text = pgbench::substitute(statement, |n, _| {
        values.get(n - 1).cloned().ok_or_else(|| {
            format!("the enqueue has a parameter ${n} the bench does not fill").into()
        })
    })?;
    Ok(format!(
        "-- Generated by outbox-postgres/benches/pg_bench.rs from the enqueue PgOutbox prepared.\n\
         BEGIN;\n{text};\nCOMMIT;\n"
    ))
}
