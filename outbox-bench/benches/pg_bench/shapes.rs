//! Claim shapes: the server's cost per message of one claim + settle round, by
//! statement shape, with no client library in the way (each shape is a pgbench
//! script, one client, batch 100, draining a pre-loaded table):
//!
//! - **pgmq**: pgmq's `read` (its crate keeps the text private; this is its shape:
//!   `UPDATE ... SET vt = ..., read_ct + 1 FROM (SELECT ... ORDER BY msg_id LIMIT n FOR
//!   UPDATE SKIP LOCKED)`) and `delete_batch`, on a queue pgmq's client created.
//! - **library**: the library's own claim and complete, captured from
//!   `pg_prepared_statements` (the drain scenario's ceiling script).
//! - **held**: a prototype, not what the library sends: the library's claim predicate
//!   selecting `FOR UPDATE SKIP LOCKED` inside a transaction held across the "publish",
//!   then `DELETE` and `COMMIT`. The row lock is the lease, so a claim writes no new
//!   row version and no index entries.
//!
//! It reports server CPU and WAL per message (both steadier than rates on a shared
//! machine) and rates, the shapes taking turns in every round.

use std::time::Instant;

use crate::harness::{fmt_ratio, json_num, median, preload, qualified, vacuum, Env, Res, Table};
use crate::pgbench;
use crate::pgmq_peer::Peer;

const SCHEMA: &str = "obx_bench_shapes";
const BATCH: u64 = 100;

/// One shape's script and what it drains.
struct Shape {
    name: &'static str,
    script: std::path::PathBuf,
    pgmq: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    rate: f64,
    server_us: f64,
    wal_bytes: f64,
}

pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    if !pgbench::available() {
        println!("pgbench not found on PATH: the claim-shapes scenario is skipped");
        return Ok(serde_json::Value::Null);
    }
    let n = env.mode.pick(100_000, 20_000);
    let repeats = std::env::var("OUTBOX_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| env.mode.pick(3, 2));
    env.heading(
        "8. Claim shapes: server cost per message",
        &format!(
            "one pgbench client draining {n} pre-loaded messages in claim + settle rounds of \
             {BATCH}: pgmq's read + delete_batch on its own queue vs the library's claim + \
             complete (captured) vs a held-lock prototype (SELECT ... FOR UPDATE SKIP LOCKED \
             in a transaction held until DELETE + COMMIT) on the library's table; server CPU \
             (every postgres process) and WAL per message; medians of {repeats} round(s), the \
             shapes taking turns"
        ),
    );
    let (admin, outbox, config) = crate::harness::installed_outbox(env, SCHEMA).await?;
    let captured = pgbench::capture(env, config).await?;
    let table = qualified(&outbox);
    let peer = Peer::setup(env).await?;
    let shapes = [
        Shape {
            name: "pgmq",
            script: pgbench::write_script(&env.out_dir, "shape_pgmq.sql", &pgmq_script())?,
            pgmq: true,
        },
        Shape {
            name: "library",
            script: pgbench::write_script(
                &env.out_dir,
                "shape_library.sql",
                &pgbench::script(&captured)?,
            )?,
            pgmq: false,
        },
        Shape {
            name: "held",
            script: pgbench::write_script(
                &env.out_dir,
                "shape_held.sql",
                &held_script(&captured.claim, &table)?,
            )?,
            pgmq: false,
        },
    ];
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); shapes.len()];
    for _ in 0..repeats {
        for (shape, runs) in shapes.iter().zip(&mut runs) {
            if shape.pgmq {
                peer.reset(n).await?;
            } else {
                sqlx::query(&format!("TRUNCATE {table}"))
                    .execute(&admin)
                    .await?;
                preload(&outbox, n).await?;
                vacuum(&admin, &table).await?;
            }
            runs.push(drain(env, &admin, &shape.script, n).await?);
            let left_in = if shape.pgmq {
                Peer::table()
            } else {
                table.clone()
            };
            let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {left_in}"))
                .fetch_one(&admin)
                .await?;
            if left != 0 {
                return Err(format!("the {} shape left {left} messages", shape.name).into());
            }
        }
    }
    let med = |runs: &[Run], f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let pgmq_rate = med(&runs[0], |r| r.rate);
    let pgmq_cpu = med(&runs[0], |r| r.server_us);
    let mut out = Table::new(&[
        "shape",
        "msgs/s",
        "server cpu us/msg",
        "WAL B/msg",
        "rate vs pgmq",
        "server cpu vs pgmq",
    ]);
    let mut json = serde_json::Map::new();
    for (shape, runs) in shapes.iter().zip(&runs) {
        let (rate, cpu, wal) = (
            med(runs, |r| r.rate),
            med(runs, |r| r.server_us),
            med(runs, |r| r.wal_bytes),
        );
        out.row(vec![
            shape.name.to_owned(),
            format!("{rate:.0}"),
            format!("{cpu:.1}"),
            format!("{wal:.0}"),
            fmt_ratio(rate / pgmq_rate),
            fmt_ratio(cpu / pgmq_cpu),
        ]);
        json.insert(
            shape.name.to_owned(),
            serde_json::json!({
                "msgs_per_s": json_num(rate),
                "server_cpu_us_per_msg": json_num(cpu),
                "wal_bytes_per_msg": json_num(wal),
            }),
        );
    }
    out.print();
    peer.teardown().await?;
    admin.close().await;
    Ok(serde_json::Value::Object(json))
}

/// Drain with one pgbench client, measuring the server's CPU and WAL.
async fn drain(env: &Env, admin: &sqlx::PgPool, script: &std::path::Path, n: u64) -> Res<Run> {
    let lsn = || async {
        sqlx::query_scalar::<_, String>("SELECT pg_current_wal_lsn()::text")
            .fetch_one(admin)
            .await
    };
    let before = lsn().await?;
    let cpu = crate::cpu::sample(outbox_testkit::cpu::Server::Postgres);
    let start = Instant::now();
    pgbench::run(env, script, 1, n / BATCH, usize::try_from(BATCH)?).await?;
    let took = start.elapsed();
    let spent = crate::cpu::since(cpu);
    let after = lsn().await?;
    let wal: f64 = sqlx::query_scalar("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8")
        .bind(after)
        .bind(before)
        .fetch_one(admin)
        .await?;
    let n_f = n as f64;
    Ok(Run {
        rate: n_f / took.as_secs_f64(),
        server_us: spent.per(n).1,
        wal_bytes: wal / n_f,
    })
}

/// pgmq's read (the shape of `pgmq::query::read`, which the crate keeps private) and
/// `delete_batch`, on the bench's queue; the read's rows fold into one array row for
/// `\gset`, as the library script's claim does.
fn pgmq_script() -> String {
    let q = Peer::table();
    format!(
        "WITH read AS (WITH cte AS (SELECT msg_id FROM {q} WHERE vt <= clock_timestamp() \
         ORDER BY msg_id ASC LIMIT :limit FOR UPDATE SKIP LOCKED) \
         UPDATE {q} t SET vt = clock_timestamp() + interval '30 seconds', \
         read_ct = read_ct + 1 FROM cte WHERE t.msg_id = cte.msg_id RETURNING t.*) \
         SELECT coalesce(array_agg(msg_id), '{{}}') AS ids FROM read \\gset\n\
         DELETE FROM {q} WHERE msg_id = ANY((:ids)::bigint[]) RETURNING msg_id;\n"
    )
}

/// The held-lock prototype: the library claim's `ready` selection (its predicate and
/// order, `FOR UPDATE SKIP LOCKED`) reading the columns a relay needs, in a
/// transaction that deletes the rows and commits.
fn held_script(claim: &str, table: &str) -> Res<String> {
    let start = claim
        .find("ready AS (")
        .ok_or("the library's claim has no `ready` selection")?
        + "ready AS (".len();
    let end = claim[start..]
        .find("SKIP LOCKED)")
        .ok_or("the library's claim `ready` selection does not end in SKIP LOCKED")?
        + start
        + "SKIP LOCKED".len();
    let ready = claim[start..end].replacen(
        "SELECT c.ctid, c.available_at, c.seq",
        "SELECT c.id, c.destination, c.partition_key, c.payload, c.content_type, c.headers, \
         c.created_at, c.attempts",
        1,
    );
    let ready = pgbench::substitute(&ready, |n, _| match n {
        1 => Ok("(:limit)::bigint".to_owned()),
        _ => Err("the ready selection takes only the limit".into()),
    })?;
    Ok(format!(
        "BEGIN;\n\
         WITH held AS ({ready}) SELECT coalesce(array_agg(id), '{{}}') AS ids FROM held \\gset\n\
         DELETE FROM {table} WHERE id = ANY((:ids)::uuid[]) RETURNING id;\n\
         COMMIT;\n"
    ))
}
