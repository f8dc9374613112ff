//! Scenario 4: does claim cost grow with dispatched history?
//!
//! Two tables under `Retention::Keep` differ only in how many dispatched rows they
//! hold (loaded with one `INSERT ... SELECT generate_series`, UUIDv7-style ids in the
//! past, then `VACUUM ANALYZE`). Over a fixed set of pending rows, each iteration times
//! the library's `claim(100)` and the `complete` that follows; then, untimed, the
//! bench puts the 100 rows back to pending so the pending set and the history stay the
//! same size throughout.

use std::time::{Duration, Instant};

use outbox_core::{store::ClaimRequest, store::Lease, OutboxStore, Retention};
use outbox_postgres::{Notify, PgOutbox, PgOutboxConfig};
use sqlx::PgPool;

use crate::harness::{
    fmt_ratio, json_num, ms, order_json, preload, qualified, ratio, vacuum, Env, Percentiles, Res,
    Table,
};
use crate::pgbench;

const SCHEMA: &str = "obx_bench_history";
const BATCH: usize = 100;
const PENDING: u64 = 1_000;
const LEASE: Duration = Duration::from_secs(30);
/// Iterations run before timing starts.
const WARM_UP: usize = 20;

/// One history size's results.
struct SizeResult {
    history: u64,
    claim: Percentiles,
    round: Percentiles,
    explain_ms: Option<f64>,
}

/// Run the scenario; returns its JSON results.
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    let sizes: [u64; 2] = env.mode.pick([10_000, 1_000_000], [10_000, 100_000]);
    let iterations = env.mode.pick(1_000_usize, 300);
    env.heading(
        "4. Claim latency vs dispatched history",
        &format!(
            "library claim(batch {BATCH}) and claim + complete over {PENDING} pending rows, \
             with {} vs {} dispatched rows kept (Retention::Keep); {iterations} timed \
             iterations after {WARM_UP} warm-up, alternating the two tables{}",
            sizes[0],
            sizes[1],
            if env.mode == crate::harness::Mode::Quick {
                "; QUICK MODE uses 10^5 instead of 10^6 history rows"
            } else {
                ""
            }
        ),
    );
    let admin = env.pool(2).await?;
    let mut subjects = Vec::new();
    for history in sizes {
        subjects.push(Subject::prepare(env, &admin, history).await?);
    }
    // Alternate the two tables, so noise from anything else on the machine lands on
    // both alike.
    for i in 0..WARM_UP + iterations {
        for subject in &mut subjects {
            subject.iterate(i >= WARM_UP).await?;
        }
    }
    let mut measured = Vec::new();
    for subject in subjects {
        measured.push(subject.finish(env, &admin).await?);
    }
    admin.close().await;

    let mut table = Table::new(&[
        "history rows",
        "claim p50 ms",
        "claim p99 ms",
        "claim+complete p50",
        "claim+complete p99",
        "EXPLAIN ANALYZE claim ms",
    ]);
    for m in &measured {
        table.row(vec![
            m.history.to_string(),
            format!("{:.2}", ms(m.claim.p50)),
            format!("{:.2}", ms(m.claim.p99)),
            format!("{:.2}", ms(m.round.p50)),
            format!("{:.2}", ms(m.round.p99)),
            m.explain_ms.map_or("-".into(), |x| format!("{x:.2}")),
        ]);
    }
    let (small, large) = (&measured[0], &measured[1]);
    let r = |f: fn(&SizeResult) -> Duration| ratio(ms(f(large)), ms(f(small)));
    let ratios = [
        r(|m| m.claim.p50),
        r(|m| m.claim.p99),
        r(|m| m.round.p50),
        r(|m| m.round.p99),
    ];
    table.row(vec![
        "ratio".to_owned(),
        fmt_ratio(ratios[0]),
        fmt_ratio(ratios[1]),
        fmt_ratio(ratios[2]),
        fmt_ratio(ratios[3]),
        String::new(),
    ]);
    table.print();
    println!(
        "target: ratio (large / small history) within 1.5x; EXPLAIN output in {}",
        env.out_dir.display()
    );
    let rows: Vec<serde_json::Value> = measured
        .iter()
        .map(|m| {
            serde_json::json!({
                "history_rows": m.history,
                "claim": m.claim.json(),
                "claim_and_complete": m.round.json(),
                "explain_analyze_claim_ms": m.explain_ms,
            })
        })
        .collect();
    Ok(serde_json::json!({
        "description": "claim latency with dispatched history kept",
        "batch": BATCH,
        "pending_rows": PENDING,
        "iterations": iterations,
        "rows": rows,
        "ratio_large_vs_small": {
            "claim_p50": json_num(ratios[0]),
            "claim_p99": json_num(ratios[1]),
            "claim_and_complete_p50": json_num(ratios[2]),
            "claim_and_complete_p99": json_num(ratios[3]),
        },
    }))
}

/// One history size: its table, loaded, with the pending set in place.
struct Subject {
    history: u64,
    table: String,
    store: PgOutbox,
    captured: pgbench::Captured,
    claims: Vec<Duration>,
    rounds: Vec<Duration>,
}

impl Subject {
    async fn prepare(env: &Env, admin: &PgPool, history: u64) -> Res<Subject> {
        let config = PgOutboxConfig::default()
            .with_schema(SCHEMA)
            .with_table(format!("outbox_history_{history}"))
            .with_notify(Notify::Off)
            .with_retention(Retention::Keep {
                window: Duration::from_secs(7 * 24 * 3600),
            });
        let outbox = PgOutbox::new(admin.clone(), config.clone())?;
        outbox.install().await?;
        let table = qualified(&outbox);
        let loading = Instant::now();
        load_history(admin, &table, history).await?;
        vacuum(admin, &table).await?;
        println!(
            "loaded {history} dispatched rows in {:.1?}",
            loading.elapsed()
        );
        // Also leaves one more dispatched row: negligible next to the history.
        let captured = pgbench::capture(env, config.clone()).await?;
        preload(&outbox, PENDING).await?;
        vacuum(admin, &table).await?;
        Ok(Subject {
            history,
            table,
            store: PgOutbox::new(env.pool(1).await?, config)?,
            captured,
            claims: Vec::new(),
            rounds: Vec::new(),
        })
    }

    /// Claim and complete one batch (timed), then put it back to pending (untimed).
    async fn iterate(&mut self, record: bool) -> Res<()> {
        let start = Instant::now();
        let claimed = self.store.claim(ClaimRequest::new(BATCH, LEASE)?).await?;
        let claimed_at = Instant::now();
        let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
        let settled = self.store.complete(&leases).await?;
        let done = Instant::now();
        if claimed.len() != BATCH || settled.applied != BATCH {
            return Err(format!(
                "claimed {} and completed {} of {BATCH}",
                claimed.len(),
                settled.applied
            )
            .into());
        }
        if record {
            self.claims.push(claimed_at - start);
            self.rounds.push(done - start);
        }
        let ids: Vec<uuid::Uuid> = leases.iter().map(|l| l.id.as_uuid()).collect();
        sqlx::query(&format!(
            "UPDATE {} SET dispatched_at = NULL, available_at = now() WHERE id = ANY($1)",
            self.table
        ))
        .bind(ids)
        .execute(self.store.pool())
        .await?;
        Ok(())
    }

    async fn finish(self, env: &Env, admin: &PgPool) -> Res<SizeResult> {
        self.store.pool().close().await;
        let explain_ms = explain_claim(env, admin, &self.captured, self.history).await?;
        Ok(SizeResult {
            history: self.history,
            claim: Percentiles::of(self.claims).ok_or("no samples")?,
            round: Percentiles::of(self.rounds).ok_or("no samples")?,
            explain_ms,
        })
    }
}

/// One `INSERT ... SELECT generate_series` of dispatched rows, 10 ms apart, ending a
/// minute ago, with UUIDv7-layout ids (48-bit ms timestamp, version 7) like the
/// library's.
async fn load_history(pool: &PgPool, table: &str, rows: u64) -> Res<()> {
    let payload = serde_json::to_vec(&order_json(0))?;
    sqlx::query(&format!(
        "INSERT INTO {table} (id, destination, payload, content_type, created_at, \
             available_at, attempts, dispatched_at) \
         SELECT encode(set_byte(overlay(r.b PLACING substring(int8send(r.ms) FROM 3) \
                    FROM 1 FOR 6), 6, (get_byte(r.b, 6) & 15) | 112), 'hex')::uuid, \
                'orders.created', $1, 'application/json', r.ts, r.ts, 1, \
                r.ts + interval '20 milliseconds' \
         FROM (SELECT uuid_send(gen_random_uuid()) AS b, s.ts, \
                      (extract(epoch FROM s.ts) * 1000)::bigint AS ms \
               FROM (SELECT now() - interval '1 minute' - ($2 - g) * interval '10 milliseconds' \
                            AS ts \
                     FROM generate_series(1, $2) AS g) AS s) AS r"
    ))
    .bind(payload)
    .bind(i64::try_from(rows)?)
    .execute(pool)
    .await?;
    Ok(())
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the library's claim text (rolled back); writes the
/// plan to a file and returns the execution time it reports.
async fn explain_claim(
    env: &Env,
    pool: &PgPool,
    captured: &pgbench::Captured,
    history: u64,
) -> Res<Option<f64>> {
    let token = uuid::Uuid::new_v4();
    let sql = pgbench::substitute(&captured.claim, |n, _| match n {
        1 => Ok(format!("{BATCH}::bigint")),
        2 => Ok(format!("{}::bigint", LEASE.as_micros())),
        3 => Ok(format!("'{token}'::uuid")),
        _ => Err("unexpected claim parameter".into()),
    })?;
    let mut tx = pool.begin().await?;
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"))
        .fetch_all(&mut *tx)
        .await?;
    tx.rollback().await?;
    let text = plan.join("\n");
    std::fs::write(
        env.out_dir
            .join(format!("explain_claim_history_{history}.txt")),
        format!("{sql}\n\n{text}\n"),
    )?;
    Ok(plan.iter().find_map(|l| {
        l.trim()
            .strip_prefix("Execution Time: ")?
            .strip_suffix(" ms")?
            .parse()
            .ok()
    }))
}
