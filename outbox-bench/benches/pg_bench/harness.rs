//! Plumbing shared by the scenarios: settings, connections, schemas, loading,
//! percentiles and plain-text tables. The message every scenario sends, the no-op
//! publisher, the median and the error type are the bench crate's
//! (`outbox_bench`), shared with the other benches.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use outbox_postgres::{PgOutbox, PgOutboxConfig};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

pub(crate) use outbox_bench::{
    median, ms, noop_publisher, order_json, order_message, percentile, Res,
};

/// Every schema the bench creates starts with this, so leftovers can be found.
pub(crate) const SCHEMA_PREFIX: &str = "obx_bench_";

/// Full or quick, and the sizes that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A few minutes on a 2-core machine.
    Full,
    /// About a minute: every scenario, smaller.
    Quick,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Quick => "quick",
        }
    }

    /// Full value or quick value.
    pub(crate) fn pick<T>(self, full: T, quick: T) -> T {
        match self {
            Mode::Full => full,
            Mode::Quick => quick,
        }
    }
}

/// What every scenario needs: where the database is and how to describe the run.
#[derive(Debug)]
pub(crate) struct Env {
    pub(crate) mode: Mode,
    pub(crate) url: String,
    pub(crate) options: PgConnectOptions,
    /// One line naming the machine, the server and its durability settings.
    pub(crate) machine: String,
    pub(crate) nproc: usize,
    /// Where results.json, pgbench scripts and EXPLAIN output go.
    pub(crate) out_dir: PathBuf,
}

impl Env {
    /// Parse `url`, create its database if missing, and describe the server.
    pub(crate) async fn connect(mode: Mode, url: String, out_dir: PathBuf) -> Res<Env> {
        let options = PgConnectOptions::from_str(&url)?;
        create_database_if_missing(&options).await?;
        let nproc = std::thread::available_parallelism().map_or(1, usize::from);
        let mut conn = PgConnection::connect_with(&options).await?;
        let setting = |name: &'static str| sqlx::query_scalar::<_, String>(name);
        let version: String = setting("SHOW server_version").fetch_one(&mut conn).await?;
        let sync: String = setting("SHOW synchronous_commit")
            .fetch_one(&mut conn)
            .await?;
        let autovacuum: String = setting("SHOW autovacuum").fetch_one(&mut conn).await?;
        let buffers: String = setting("SHOW shared_buffers").fetch_one(&mut conn).await?;
        conn.close().await?;
        let machine = format!(
            "nproc={nproc} (client and server share them); PostgreSQL {version} at {}:{} \
             (synchronous_commit={sync}, autovacuum={autovacuum}, shared_buffers={buffers})",
            options.get_host(),
            options.get_port(),
        );
        std::fs::create_dir_all(&out_dir)?;
        Ok(Env {
            mode,
            url,
            options,
            machine,
            nproc,
            out_dir,
        })
    }

    /// A pool of exactly `size` connections, all opened before it is returned so no
    /// measurement pays for connecting.
    pub(crate) async fn pool(&self, size: u32) -> Res<PgPool> {
        pool_at(&self.options, size).await
    }

    /// Print a scenario's heading: what is compared, on what, in which mode.
    pub(crate) fn heading(&self, title: &str, compared: &str) {
        println!();
        println!("== {title} ==");
        println!("compared: {compared}");
        println!("machine:  {}", self.machine);
        println!("mode:     {}", self.mode.name());
    }
}

/// A pool of exactly `size` connections to the server `options` name (the shared
/// server, or a scenario's private cluster), all opened before it is returned.
pub(crate) async fn pool_at(options: &PgConnectOptions, size: u32) -> Res<PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(size)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(options.clone())
        .await?;
    let mut held = Vec::new();
    for _ in 0..size {
        held.push(pool.acquire().await?);
    }
    drop(held);
    Ok(pool)
}

async fn create_database_if_missing(options: &PgConnectOptions) -> Res<()> {
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let admin = options.clone().database("postgres");
    let mut conn = PgConnection::connect_with(&admin).await.map_err(|e| {
        format!(
            "cannot connect to PostgreSQL at {}:{} ({e}); start it (scripts/services.sh) \
             or set OUTBOX_PG_URL",
            options.get_host(),
            options.get_port()
        )
    })?;
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut conn)
        .await?;
    if exists.is_none() {
        outbox_core::backend::validate_identifier("database", &name, 63)?;
        println!("creating database {name}");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await?;
    }
    conn.close().await?;
    Ok(())
}

/// Drop every schema this bench made (this run's or a crashed run's).
pub(crate) async fn drop_bench_schemas(pool: &PgPool) -> Res<()> {
    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1)")
            .bind(SCHEMA_PREFIX)
            .fetch_all(pool)
            .await?;
    for schema in schemas {
        sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// An installed outbox in `schema`, without NOTIFY, on a pool of two connections, and
/// its config (for capturing its statements).
pub(crate) async fn installed_outbox(
    env: &Env,
    schema: &str,
) -> Res<(PgPool, PgOutbox, PgOutboxConfig)> {
    let config = PgOutboxConfig::default()
        .with_schema(schema)
        .with_notify(outbox_postgres::Notify::Off);
    let admin = env.pool(2).await?;
    let outbox = PgOutbox::new(admin.clone(), config.clone())?;
    outbox.install().await?;
    Ok((admin, outbox, config))
}

/// `"schema"."table"` of an outbox, for the bench's own SQL.
pub(crate) fn qualified(outbox: &PgOutbox) -> String {
    outbox.qualified_name().to_string()
}

/// `VACUUM ANALYZE` a table, so every run starts without dead rows and with statistics
/// (autovacuum may be off on the server).
pub(crate) async fn vacuum(pool: &PgPool, table: &str) -> Res<()> {
    sqlx::query(&format!("VACUUM ANALYZE {table}"))
        .execute(pool)
        .await?;
    Ok(())
}

/// Enqueue `n` messages through the library, 1,000 per transaction.
pub(crate) async fn preload(outbox: &PgOutbox, n: u64) -> Res<()> {
    let mut next = 0;
    while next < n {
        let end = (next + 1_000).min(n);
        let batch = (next..end)
            .map(order_message)
            .collect::<outbox_core::Result<Vec<_>>>()?;
        let mut tx = outbox.pool().begin().await?;
        outbox.enqueue(&mut tx, &batch).await?;
        tx.commit().await?;
        next = end;
    }
    Ok(())
}

/// Nearest-rank percentiles of a sample.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Percentiles {
    pub(crate) count: usize,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

impl Percentiles {
    /// `None` for an empty sample.
    pub(crate) fn of(mut sample: Vec<Duration>) -> Option<Percentiles> {
        if sample.is_empty() {
            return None;
        }
        sample.sort_unstable();
        Some(Percentiles {
            count: sample.len(),
            p50: percentile(&sample, 500),
            p99: percentile(&sample, 990),
            max: *sample.last()?,
        })
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "samples": self.count,
            "p50_ms": ms(self.p50),
            "p99_ms": ms(self.p99),
            "max_ms": ms(self.max),
        })
    }
}

/// `part / whole`, or NaN when `whole` is zero (printed as `-`).
pub(crate) fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        f64::NAN
    }
}

/// A ratio with two decimals, `-` when undefined.
pub(crate) fn fmt_ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.2}")
    } else {
        "-".to_owned()
    }
}

/// A JSON number, or null when undefined.
pub(crate) fn json_num(x: f64) -> serde_json::Value {
    if x.is_finite() {
        serde_json::json!(x)
    } else {
        serde_json::Value::Null
    }
}

/// A plain-text table with right-aligned columns.
#[derive(Debug)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn print(&self) {
        let mut widths: Vec<usize> = self.header.iter().map(String::len).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (cell, w) in cells.iter().zip(&widths) {
                let _ = write!(out, "  {cell:>w$}");
            }
            out
        };
        println!("{}", line(&self.header));
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        println!("{}", line(&rule));
        for row in &self.rows {
            println!("{}", line(row));
        }
    }
}
