//! Drain throughput of the SQLite backend: how fast relays empty a pre-loaded outbox
//! with a no-op publisher, against the library's own claim + complete statements run
//! directly through sqlx (the ceiling: the same SQL without the relay, decoding and
//! bookkeeping), in the same run on the same kind of database file.
//!
//! Run: `cargo bench -p outbox-bench --bench sqlite_bench` (add `-- --quick`, or set
//! `OUTBOX_BENCH_QUICK=1`, for a smaller, single-repeat run; `-- --batch 100` for one
//! batch size).
//!
//! Each figure is the median of the repeats; the two drains take turns, each on a
//! fresh database file in the system's temporary directory, opened with
//! `outbox_sqlite::open` (WAL, `synchronous = FULL`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use outbox_bench::{drain_library, median, run_workers, storage, DRAIN_TIMEOUT};
use outbox_core::{NewMessage, Result};
use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};
use serde_json::json;
use sqlx::SqlitePool;

const BATCHES: [usize; 3] = [1, 10, 100];
const RELAYS: [usize; 2] = [1, 2];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let quick = outbox_bench::quick();
    let repeats = if quick { 1 } else { 3 };
    let args: Vec<String> = std::env::args().collect();
    let only: Option<usize> = args
        .iter()
        .position(|a| a == "--batch")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok());
    println!(
        "SQLite drain throughput (no-op publisher): library Relays (claim batch = publish \
         batch) vs the library's own claim + complete SQL run through sqlx by as many \
         workers; median of {repeats} run(s), msgs/s\n"
    );
    println!(
        "| batch | relays | msgs | library/s | raw sqlx/s | library/raw |\n|---:|---:|---:|---:|---:|---:|"
    );
    for batch in BATCHES.into_iter().filter(|b| only.is_none_or(|o| o == *b)) {
        let messages: u64 = match (batch, quick) {
            (1, false) => 2_000,
            (10, false) => 10_000,
            (_, false) => 40_000,
            (1, true) => 500,
            (10, true) => 2_000,
            (_, true) => 8_000,
        };
        for relays in RELAYS {
            let mut library = Vec::new();
            let mut raw = Vec::new();
            for _ in 0..repeats {
                library.push(
                    run(messages, |db| async move {
                        drain_library(&db.outbox, batch, relays, messages).await
                    })
                    .await?,
                );
                raw.push(run(messages, |db| drain_raw(db, batch, relays)).await?);
            }
            let (library, raw) = (median(&library), median(&raw));
            println!(
                "| {batch} | {relays} | {messages} | {library:.0} | {raw:.0} | {:.2} |",
                library / raw
            );
        }
    }
    Ok(())
}

/// A fresh database file loaded with `messages`, drained by `drain`; msgs/s.
async fn run<F, Fut>(messages: u64, drain: F) -> Result<f64>
where
    F: FnOnce(Db) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let db = Db::new().await?;
    let chunk: Vec<NewMessage> = (0..1000)
        .map(|n| {
            NewMessage::builder("bench.drain")
                .payload(format!("message {n}").into_bytes())
                .build()
        })
        .collect::<Result<_>>()?;
    let mut left = messages;
    while left > 0 {
        let n = usize::try_from(left.min(1000)).unwrap_or(1000);
        let fresh: Vec<NewMessage> = chunk[..n]
            .iter()
            .map(|m| {
                NewMessage::builder(m.destination())
                    .payload(m.payload().to_vec())
                    .build()
            })
            .collect::<Result<_>>()?;
        let mut tx = db
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(storage)?;
        db.outbox.enqueue(&mut tx, &fresh).await?;
        tx.commit().await.map_err(storage)?;
        left -= n as u64;
    }
    let started = Instant::now();
    let pool = db.pool.clone();
    let path = db.path.clone();
    tokio::time::timeout(DRAIN_TIMEOUT, drain(db))
        .await
        .map_err(|_| outbox_core::Error::new(outbox_core::ErrorKind::Timeout, "drain"))??;
    let elapsed = started.elapsed();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
        .fetch_one(&pool)
        .await
        .map_err(storage)?;
    assert_eq!(left, 0, "the drain left rows behind");
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    Ok(messages as f64 / elapsed.as_secs_f64())
}

struct Db {
    pool: SqlitePool,
    outbox: SqliteOutbox,
    path: PathBuf,
}

impl Db {
    async fn new() -> Result<Db> {
        let path = std::env::temp_dir().join(format!(
            "outbox-sqlite-bench-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let pool = outbox_sqlite::open(&path).await?;
        let outbox = SqliteOutbox::new(pool.clone(), SqliteOutboxConfig::default())?;
        outbox.install().await?;
        Ok(Db { pool, outbox, path })
    }
}

/// The library's own statements (`SqliteOutbox::claim_complete_sql`, a hidden
/// accessor), in the order a claim and a complete run them, by `workers` tasks until
/// nothing is due.
async fn drain_raw(db: Db, batch: usize, workers: usize) -> Result<()> {
    let [select, update, complete] = db.outbox.claim_complete_sql().map(str::to_owned);
    let sql = Arc::new((select, update, complete));
    run_workers(workers, |_| {
        let (pool, sql) = (db.pool.clone(), sql.clone());
        async move { raw_worker(pool, &sql, batch).await }
    })
    .await
}

fn now_us() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros(),
    )
    .unwrap_or(i64::MAX)
}

async fn raw_worker(pool: SqlitePool, sql: &(String, String, String), batch: usize) -> Result<()> {
    let (select, update, complete) = sql;
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    loop {
        // As the library: a read first, then the claim in an immediate transaction.
        let any: Option<(i64, i64)> = sqlx::query_as(select)
            .bind(limit)
            .bind(now_us())
            .fetch_optional(&pool)
            .await
            .map_err(storage)?;
        if any.is_none() {
            return Ok(());
        }
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(storage)?;
        let now = now_us();
        let due: Vec<(i64, i64)> = sqlx::query_as(select)
            .bind(limit)
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(storage)?;
        if due.is_empty() {
            continue;
        }
        let seqs: Vec<i64> = due.iter().map(|(seq, _)| *seq).collect();
        let token = uuid::Uuid::new_v4();
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as::<_, (i64, Vec<u8>)>(update)
            .bind(json!(seqs).to_string())
            .bind(now + 60_000_000)
            .bind(token.as_bytes().to_vec())
            .fetch_all(&mut *tx)
            .await
            .map_err(storage)?;
        tx.commit().await.map_err(storage)?;
        let token = token.simple().to_string();
        let leases: Vec<_> = rows
            .iter()
            .map(|(_, id)| {
                let id = uuid::Uuid::from_slice(id).unwrap_or_default();
                json!([id.simple().to_string(), token])
            })
            .collect();
        sqlx::query(complete)
            .bind(json!(leases).to_string())
            .execute(&pool)
            .await
            .map_err(storage)?;
    }
}
