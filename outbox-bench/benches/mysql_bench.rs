//! Benchmarks of the MySQL / MariaDB outbox against a real server, each compared in
//! the same run with a baseline, the two taking turns:
//!
//! 1. **Drain**: relays (batch {10, 100, 1000} x relays {1, 2, 4}, a no-op publisher)
//!    empty a pre-loaded outbox, against the library's own claim + complete statements
//!    (`MySqlOutbox::relay_sql`, a hidden accessor) driven by a minimal loop on the same connections (the
//!    outbox's relay pool), by as many workers: the ceiling without the relay,
//!    decoding and bookkeeping.
//! 2. **Enqueue**: transactions of one business insert plus one enqueued message,
//!    against the business insert alone, by 4 concurrent writers.
//!
//! Each row also gives the CPU per message of this process and of the server
//! (`mariadbd` / `mysqld` on this machine, read from `/proc`).
//!
//! ```text
//! cargo bench -p outbox-bench --bench mysql_bench               # median of 3
//! cargo bench -p outbox-bench --bench mysql_bench -- --quick    # one run each, fewer messages
//! ```
//!
//! Environment: `OUTBOX_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/outbox_test`).
//! Every run gets its own `obx_bench_*` database, dropped afterwards.

use chrono::NaiveDateTime;
use outbox_bench::{drain_library, median_by, run_workers, storage, Figure};
use outbox_core::{relay::DEFAULT_PIPELINE_DEPTH, ClaimMode, NewMessage, Result};
use outbox_mysql::{MySqlClaimConfig, MySqlOutbox, MySqlOutboxConfig};
use outbox_testkit::cpu::Server;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, Row};
use uuid::Uuid;

const BATCHES: [usize; 3] = [10, 100, 1000];
const RELAYS: [usize; 3] = [1, 2, 4];
const WRITERS: usize = 4;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let quick = outbox_bench::quick();
    let repeats = if quick { 1 } else { 3 };
    let url = std::env::var("OUTBOX_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/outbox_test".to_owned());
    let pool = MySqlPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await
        .map_err(storage)?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await
        .map_err(storage)?;
    println!(
        "outbox-mysql on {version}, {} mode, median of {repeats}; CPU in µs per message \
         (client = this process, server = the database process)\n",
        if quick { "quick" } else { "full" }
    );
    println!(
        "## Drain: relays (lease and held-lock claims) vs the library's lease claim + \
         complete SQL in a minimal loop\n"
    );
    println!(
        "| batch | relays | msgs | library msg/s | held-lock msg/s | raw SQL msg/s | \
         library/raw | held/raw | library CPU client/server | held CPU client/server | \
         raw CPU client/server |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for batch in BATCHES {
        let messages: u64 = match (batch, quick) {
            (10, true) => 3_000,
            (100, true) => 10_000,
            (_, true) => 20_000,
            (10, false) => 10_000,
            (_, false) => 40_000,
        };
        for relays in RELAYS {
            let (mut library, mut held, mut raw) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..repeats {
                library.push(drain(&pool, messages, batch, relays, Drain::Lease).await?);
                held.push(drain(&pool, messages, batch, relays, Drain::Held).await?);
                raw.push(drain(&pool, messages, batch, relays, Drain::Raw).await?);
            }
            let (library, held, raw) = (median(library), median(held), median(raw));
            println!(
                "| {batch} | {relays} | {messages} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} \
                 | {} | {} |",
                library.rate,
                held.rate,
                raw.rate,
                library.rate / raw.rate,
                held.rate / raw.rate,
                cpu(&library),
                cpu(&held),
                cpu(&raw)
            );
        }
    }
    println!("\n## Enqueue: business insert + one message vs the business insert alone\n");
    println!(
        "| writers | txns | with outbox tx/s | insert alone tx/s | ratio | \
         with outbox CPU client/server | alone CPU client/server |\n\
         |---:|---:|---:|---:|---:|---:|---:|"
    );
    let txns = if quick { 4_000 } else { 20_000 };
    let (mut with, mut alone) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        with.push(enqueue(&pool, txns, true).await?);
        alone.push(enqueue(&pool, txns, false).await?);
    }
    let (with, alone) = (median(with), median(alone));
    println!(
        "| {WRITERS} | {txns} | {:.0} | {:.0} | {:.2} | {} | {} |",
        with.rate,
        alone.rate,
        with.rate / alone.rate,
        cpu(&with),
        cpu(&alone)
    );
    Ok(())
}

/// A figure's CPU per unit, client / server.
fn cpu(figure: &Figure) -> String {
    format!("{:.0} / {:.0}", figure.client_us, figure.server_us)
}

/// The run of median rate.
fn median(sample: Vec<Figure>) -> Figure {
    median_by(&sample, |f| f.rate).expect("at least one run")
}

/// Time `work`, which handles `units` things; its rate and CPU per unit (this process
/// and the server).
async fn measure(
    units: u64,
    work: impl std::future::Future<Output = Result<()>>,
) -> Result<Figure> {
    Figure::measure(units, Server::MySql, work).await
}

/// An installed outbox in a fresh database.
async fn outbox(pool: &MySqlPool) -> Result<MySqlOutbox> {
    let schema = format!("obx_bench_{}", &Uuid::new_v4().simple().to_string()[..12]);
    let outbox = MySqlOutbox::new(
        pool.clone(),
        MySqlOutboxConfig::default().with_schema(schema),
    )?;
    outbox.install().await?;
    Ok(outbox)
}

async fn drop_database(outbox: &MySqlOutbox) -> Result<()> {
    let schema = outbox.qualified_name().quoted_schema();
    sqlx::raw_sql(&format!("DROP DATABASE {schema}"))
        .execute(outbox.pool())
        .await
        .map_err(storage)?;
    Ok(())
}

/// Who drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    /// Relays on a lease-mode store.
    Lease,
    /// Relays on a held-lock store (connections for every relay's pipeline).
    Held,
    /// The lease statements in a minimal loop.
    Raw,
}

/// Load `messages`, then drain them as `how` says.
async fn drain(
    pool: &MySqlPool,
    messages: u64,
    batch: usize,
    workers: usize,
    how: Drain,
) -> Result<Figure> {
    let mut outbox = outbox(pool).await?;
    if how == Drain::Held {
        let connections = u32::try_from(workers * (DEFAULT_PIPELINE_DEPTH + 1)).unwrap_or(u32::MAX);
        outbox = outbox.with_claims(
            MySqlClaimConfig::default()
                .with_claim_mode(ClaimMode::HeldLock)
                .with_held_connections(connections),
        );
    }
    let mut left = messages;
    while left > 0 {
        let n = left.min(1000);
        let chunk: Vec<NewMessage> = (0..n)
            .map(|i| {
                NewMessage::builder("bench.drain")
                    .payload(format!("message {i}").into_bytes())
                    .build()
            })
            .collect::<Result<_>>()?;
        let mut tx = pool.begin().await.map_err(storage)?;
        outbox.enqueue(&mut tx, &chunk).await?;
        tx.commit().await.map_err(storage)?;
        left -= n;
    }
    let figure = if how == Drain::Raw {
        measure(messages, drain_raw(&outbox, batch, workers)).await?
    } else {
        measure(messages, drain_library(&outbox, batch, workers, messages)).await?
    };
    let sql = format!("SELECT COUNT(*) FROM {}", outbox.qualified_name());
    let rest: i64 = sqlx::query_scalar(&sql)
        .fetch_one(pool)
        .await
        .map_err(storage)?;
    assert_eq!(rest, 0, "the drain left rows behind");
    drop_database(&outbox).await?;
    Ok(figure)
}

/// The library's statements in the order a claim and a complete run them, on the
/// outbox's relay connections, by `workers` tasks until nothing is due.
async fn drain_raw(outbox: &MySqlOutbox, batch: usize, workers: usize) -> Result<()> {
    run_workers(workers, |_| {
        let outbox = outbox.clone();
        async move { raw_worker(&outbox, batch).await }
    })
    .await
}

async fn raw_worker(outbox: &MySqlOutbox, batch: usize) -> Result<()> {
    let pool = outbox.relay_pool();
    let sql = |name: &str, n: usize| outbox.relay_sql(name, n).expect("a relay statement");
    let claim = sql("claim", 1);
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    loop {
        let mut tx = pool.begin().await.map_err(storage)?;
        let rows: Vec<(Uuid, NaiveDateTime)> = sqlx::query(&claim)
            .bind(60_000_000_i64)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(storage)?
            .iter()
            .map(|r| (r.get("id"), r.get("lease_expires_at")))
            .collect();
        if rows.is_empty() {
            tx.commit().await.map_err(storage)?;
            return Ok(());
        }
        let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
        let n = ids.len().next_power_of_two();
        let [lease, lock, complete] = ["lease", "lock", "complete"].map(|s| sql(s, ids.len()));
        let token = Uuid::new_v4();
        pad(&ids, n, sqlx::query(&lease).bind(rows[0].1).bind(token))
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        tx.commit().await.map_err(storage)?;
        // Complete: lock by id, check the token, delete.
        let mut tx = pool.begin().await.map_err(storage)?;
        // The lock and the complete take the ids as one JSON array of hex, as the store
        // sends them.
        let hex: Vec<String> = ids.iter().map(|id| id.simple().to_string()).collect();
        let json = serde_json::Value::from(hex).to_string();
        let locked: Vec<(Uuid, Option<Uuid>, bool, NaiveDateTime)> = sqlx::query_as(&lock)
            .bind(0_i64)
            .bind(&json)
            .fetch_all(&mut *tx)
            .await
            .map_err(storage)?;
        assert!(locked
            .iter()
            .all(|(_, t, live, _)| *live && *t == Some(token)));
        sqlx::query(&complete)
            .bind(&json)
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        tx.commit().await.map_err(storage)?;
    }
}

type Query<'q> = sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>;

/// `ids` bound, the last repeated up to `n`, as the store pads its lists.
fn pad<'q>(ids: &[Uuid], n: usize, query: Query<'q>) -> Query<'q> {
    (0..n).fold(query, |q, i| q.bind(ids[i.min(ids.len() - 1)]))
}

/// `txns` transactions by [`WRITERS`] tasks: a business insert, and with `outbox` one
/// enqueued message.
async fn enqueue(pool: &MySqlPool, txns: u64, with_outbox: bool) -> Result<Figure> {
    let outbox = outbox(pool).await?;
    let orders = format!("{}.orders", outbox.qualified_name().quoted_schema());
    sqlx::raw_sql(&format!(
        "CREATE TABLE {orders} (id BIGINT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(64) NOT NULL, \
         amount BIGINT NOT NULL) ENGINE = InnoDB"
    ))
    .execute(pool)
    .await
    .map_err(storage)?;
    let insert = format!("INSERT INTO {orders} (item, amount) VALUES (?, ?)");
    let per_writer = txns / WRITERS as u64;
    let figure = measure(
        per_writer * WRITERS as u64,
        run_workers(WRITERS, |_| {
            let (pool, outbox, insert) = (pool.clone(), outbox.clone(), insert.clone());
            async move {
                for n in 0..per_writer {
                    let mut tx = pool.begin().await.map_err(storage)?;
                    sqlx::query(&insert)
                        .bind("book")
                        .bind(i64::try_from(n).unwrap_or(0))
                        .execute(&mut *tx)
                        .await
                        .map_err(storage)?;
                    if with_outbox {
                        let message = NewMessage::builder("orders.created")
                            .payload(b"{\"item\":\"book\"}".to_vec())
                            .build()?;
                        outbox.enqueue(&mut tx, &[message]).await?;
                    }
                    tx.commit().await.map_err(storage)?;
                }
                Ok(())
            }
        }),
    )
    .await?;
    drop_database(&outbox).await?;
    Ok(figure)
}
