//! Process-level chaos tests for the PostgreSQL, MySQL / MariaDB and DynamoDB outboxes.
//!
//! `tests/chaos.rs` drives `chaos-worker` processes (see `src/bin/chaos-worker.rs`),
//! each running one [`Relay`](outbox_core::Relay) over an outbox the test installed,
//! with a [`TablePublisher`] that records every publish as a row of
//! `<schema>.published` on PostgreSQL. The tests SIGKILL workers mid-drain (on
//! DynamoDB Local under injected throttles, cancelled transactions and a lagging index:
//! see [`dynamodb`]), restart a private PostgreSQL cluster under them, plant poison
//! rows and enqueue a message whose publish aborts the worker ([`ENV_CRASH_ON`]), then
//! read the outbox and the `published` table.
//!
//! ```sh
//! eval "$(scripts/services.sh)"
//! cargo test -p outbox-chaos -- --nocapture   # prints one summary line per test
//! ```
//!
//! This crate is not published; the items below are shared by the worker binary and
//! the tests.

use std::fmt;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    Error, ErrorKind, KeyOrder, Message, PublishOutcome, Publisher, RelayConfig, RetryPolicy,
};
use sqlx::PgPool;

pub mod dynamodb;
pub mod streams;

/// Environment variable: the PostgreSQL URL the worker connects to (required).
pub const ENV_URL: &str = "OUTBOX_CHAOS_PG_URL";
/// Environment variable: a MySQL / MariaDB URL; when set, the worker's outbox is a
/// `MySqlOutbox` in the database named by [`ENV_SCHEMA`] on that server, and only the
/// `published` table stays on PostgreSQL.
pub const ENV_MYSQL_URL: &str = "OUTBOX_CHAOS_MYSQL_URL";
/// Environment variable: a DynamoDB endpoint (`http://127.0.0.1:8000`, DynamoDB Local);
/// when set, the worker's outbox is a `DynamoOutbox` in the table named by
/// [`ENV_TABLE`] there, its client under the fault mix of [`dynamodb::fault_mix`], and
/// only the `published` table stays on PostgreSQL.
pub const ENV_DYNAMODB_URL: &str = "OUTBOX_CHAOS_DYNAMODB_URL";
/// Environment variable: the seed of a DynamoDB worker's fault injector (a `u64`;
/// random when unset). The worker prints the seed it uses, so a run can be replayed.
pub const ENV_FAULT_SEED: &str = "OUTBOX_CHAOS_FAULT_SEED";
/// Environment variable: the schema holding the outbox and `published` tables (required).
pub const ENV_SCHEMA: &str = "OUTBOX_CHAOS_SCHEMA";
/// Environment variable: the outbox table (default `outbox_messages`).
pub const ENV_TABLE: &str = "OUTBOX_CHAOS_TABLE";
/// Environment variable: the worker's id, recorded with each publish (default `worker`).
pub const ENV_WORKER: &str = "OUTBOX_CHAOS_WORKER";
/// Environment variable: `1` for per-key ordering, anything else for unordered.
pub const ENV_PER_KEY: &str = "OUTBOX_CHAOS_PER_KEY";
/// Environment variable: connections in the worker's pool (default 4).
pub const ENV_POOL_SIZE: &str = "OUTBOX_CHAOS_POOL_SIZE";
/// Environment variable: `1` for held-lock claims (`ClaimMode::HeldLock`, PostgreSQL or
/// MariaDB), anything else for lease claims.
pub const ENV_HELD_LOCK: &str = "OUTBOX_CHAOS_HELD_LOCK";
/// Environment variable: a destination; the worker's publisher aborts the whole process
/// (SIGABRT, no cleanup) when it is asked to publish a message to it, as a message that
/// crashes its relay would.
pub const ENV_CRASH_ON: &str = "OUTBOX_CHAOS_CRASH_ON";
/// Environment variable: the relay's `max_attempts` (default 20, see [`relay_config`]).
pub const ENV_MAX_ATTEMPTS: &str = "OUTBOX_CHAOS_MAX_ATTEMPTS";

/// Messages per claim in every worker: the most leases one worker holds at a time (its
/// relay loop claims the next batch only after settling the previous one).
pub const BATCH_SIZE: usize = 10;
/// The lease each claim takes: how long a killed worker's messages stay blocked.
pub const LEASE: Duration = Duration::from_secs(2);

/// The longest one publish call (five `INSERT`s) may take before its messages count
/// as failed.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

/// What a worker runs on, read from the `ENV_*` variables.
#[derive(Clone)]
pub struct WorkerSettings {
    /// PostgreSQL URL.
    pub url: String,
    /// Schema of the outbox and `published` tables.
    pub schema: String,
    /// Outbox table.
    pub table: String,
    /// The MySQL / MariaDB URL of the outbox, if it is not on PostgreSQL.
    pub mysql_url: Option<String>,
    /// The DynamoDB endpoint of the outbox, if it is not on PostgreSQL.
    pub dynamodb_url: Option<String>,
    /// The fault injector's seed on DynamoDB, if given.
    pub fault_seed: Option<u64>,
    /// Worker id, recorded in `published.worker`.
    pub worker: String,
    /// Claim ordering.
    pub ordering: KeyOrder,
    /// Pool size.
    pub pool_size: u32,
    /// Held-lock claims instead of leases (PostgreSQL or MariaDB).
    pub held_lock: bool,
    /// The destination whose messages abort the worker process when published.
    pub crash_on: Option<String>,
    /// The relay's `max_attempts`, if not [`relay_config`]'s.
    pub max_attempts: Option<u32>,
}

impl fmt::Debug for WorkerSettings {
    // The URL may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerSettings")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("worker", &self.worker)
            .field("ordering", &self.ordering)
            .field("pool_size", &self.pool_size)
            .field("fault_seed", &self.fault_seed)
            .field("held_lock", &self.held_lock)
            .field("crash_on", &self.crash_on)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl WorkerSettings {
    /// Read the settings from the environment.
    ///
    /// # Errors
    /// A message naming the variable that is missing or malformed.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let required = |name: &str| var(name).ok_or_else(|| format!("{name} is not set"));
        // A variable that is set must parse as a `T`.
        fn parsed<T: std::str::FromStr>(
            name: &str,
            value: Option<String>,
        ) -> Result<Option<T>, String> {
            value
                .map(|v| {
                    v.trim().parse().map_err(|_| {
                        format!("{name}={v:?} is not a {}", std::any::type_name::<T>())
                    })
                })
                .transpose()
        }
        let pool_size = parsed(ENV_POOL_SIZE, var(ENV_POOL_SIZE))?.unwrap_or(4);
        let max_attempts = parsed(ENV_MAX_ATTEMPTS, var(ENV_MAX_ATTEMPTS))?;
        let fault_seed = parsed(ENV_FAULT_SEED, var(ENV_FAULT_SEED))?;
        Ok(WorkerSettings {
            url: required(ENV_URL)?,
            schema: required(ENV_SCHEMA)?,
            table: var(ENV_TABLE).unwrap_or_else(|| "outbox_messages".to_owned()),
            mysql_url: var(ENV_MYSQL_URL),
            dynamodb_url: var(ENV_DYNAMODB_URL),
            fault_seed,
            worker: var(ENV_WORKER).unwrap_or_else(|| "worker".to_owned()),
            ordering: if var(ENV_PER_KEY).as_deref() == Some("1") {
                KeyOrder::PerKey
            } else {
                KeyOrder::Unordered
            },
            pool_size,
            held_lock: var(ENV_HELD_LOCK).as_deref() == Some("1"),
            crash_on: var(ENV_CRASH_ON),
            max_attempts,
        })
    }

    /// [`relay_config`] for this worker, with its `max_attempts` if one is set.
    pub fn relay_config(&self) -> RelayConfig {
        let config = relay_config(&self.worker);
        match self.max_attempts {
            Some(n) => config.with_retry(
                RetryPolicy::new(n)
                    .with_initial_delay(Duration::from_millis(10))
                    .with_max_delay(Duration::from_millis(200)),
            ),
            None => config,
        }
    }
}

/// The relay settings of every worker: short leases, small batches, fast polls, so
/// that kills and restarts cost little time.
pub fn relay_config(name: &str) -> RelayConfig {
    RelayConfig::default()
        .with_name(name)
        .with_batch_size(BATCH_SIZE)
        .with_publish_batch_size(5)
        .with_publish_concurrency(2)
        .with_lease(LEASE)
        // Set explicitly: one wave of publishes must fit in the lease with room to spare.
        .with_publish_timeout(PUBLISH_TIMEOUT)
        .with_poll_interval(Duration::from_millis(10))
        .with_max_poll_interval(Duration::from_millis(100))
        .with_retry(
            RetryPolicy::new(20)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(200)),
        )
        .with_shutdown_grace(Duration::from_secs(1))
}

/// How often a log-tailing worker reports its confirmed position: with
/// [`WAL_BATCH_SIZE`], [`WAL_PUBLISH_CONCURRENCY`] and the test's transactions, what
/// bounds its duplicate window.
pub const WAL_STATUS_INTERVAL: Duration = Duration::from_millis(20);
/// Messages per publish call of a log-tailing worker.
pub const WAL_BATCH_SIZE: usize = 10;
/// Publish calls a log-tailing worker has in flight at once (the default).
pub const WAL_PUBLISH_CONCURRENCY: usize = 4;

/// The log-tailing outbox of a chaos schema: slot, publication and message prefix are
/// all named after the schema, dead letters live in its `outbox_messages` table.
pub fn wal_outbox_config(schema: &str) -> outbox_postgres_wal::WalOutboxConfig {
    outbox_postgres_wal::WalOutboxConfig::default()
        .with_slot(schema)
        .with_publication(schema)
        .with_prefix(schema)
        .with_dead_letters(outbox_postgres::PgOutboxConfig::default().with_schema(schema))
}

/// The settings of every log-tailing worker: small batches, frequent status updates,
/// quick reconnects.
pub fn wal_relay_config() -> outbox_postgres_wal::WalRelayConfig {
    outbox_postgres_wal::WalRelayConfig::default()
        .with_batch_size(WAL_BATCH_SIZE)
        .with_publish_concurrency(WAL_PUBLISH_CONCURRENCY)
        .with_status_interval(WAL_STATUS_INTERVAL)
        .with_initial_reconnect_backoff(Duration::from_millis(20))
        .with_max_reconnect_backoff(Duration::from_millis(500))
        .with_lock_retry(Duration::from_millis(50))
        .with_lag_interval(Duration::from_millis(500))
        .with_retry(
            RetryPolicy::new(20)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(200)),
        )
}

/// DDL of `<schema>.published`, the record of every publish. `schema` must be a plain
/// identifier (it is double-quoted, not escaped).
pub fn published_ddl(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\".published (\
         message_id uuid NOT NULL, partition_key text, payload bytea NOT NULL, \
         worker text NOT NULL, published_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
         seq bigserial PRIMARY KEY)"
    )
}

/// A publisher that stands in for a broker: each publish is one committed `INSERT` into
/// `<schema>.published`, so what was published survives the worker being killed.
#[derive(Debug, Clone)]
pub struct TablePublisher {
    pool: PgPool,
    insert: String,
    worker: String,
    crash_on: Option<String>,
}

impl TablePublisher {
    /// A publisher writing to `<schema>.published` through `pool`. `schema` must be a
    /// plain identifier (it is double-quoted, not escaped).
    pub fn new(pool: PgPool, schema: &str, worker: impl Into<String>) -> Self {
        TablePublisher {
            pool,
            insert: format!(
                "INSERT INTO \"{schema}\".published (message_id, partition_key, payload, worker) \
                 VALUES ($1, $2, $3, $4)"
            ),
            worker: worker.into(),
            crash_on: None,
        }
    }

    /// Abort the process (SIGABRT: no destructor, no settle, no shutdown) when asked to
    /// publish a message to `destination`, before publishing it.
    pub fn crash_on(mut self, destination: Option<String>) -> Self {
        self.crash_on = destination;
        self
    }
}

#[async_trait]
impl Publisher for TablePublisher {
    /// One `INSERT` per message, in order. After the first failure the rest of the
    /// batch is not tried (the database is likely unreachable) and counts as retryable.
    async fn publish(&self, batch: &[Message]) -> outbox_core::Result<Vec<PublishOutcome>> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for message in batch {
            if self.crash_on.as_deref() == Some(message.destination.as_str()) {
                println!(
                    "chaos-worker {}: crashing on message {} (attempt {})",
                    self.worker, message.id, message.attempts
                );
                std::process::abort();
            }
            if let Some(PublishOutcome::Retryable(_)) = outcomes.last() {
                outcomes.push(PublishOutcome::Retryable(
                    "not tried after an earlier insert failed".to_owned(),
                ));
                continue;
            }
            let inserted = sqlx::query(&self.insert)
                .bind(message.id.as_uuid())
                .bind(message.partition_key.as_deref())
                .bind(message.payload.as_slice())
                .bind(self.worker.as_str())
                .execute(&self.pool)
                .await;
            outcomes.push(match inserted {
                Ok(_) => PublishOutcome::Published,
                Err(e) => PublishOutcome::Retryable(format!("insert into published failed: {e}")),
            });
        }
        Ok(outcomes)
    }
}

/// A sqlx error as a core storage error.
pub fn storage_error(what: &str, e: sqlx::Error) -> Error {
    Error::new(ErrorKind::Storage, what.to_owned()).with_source(e)
}

/// The body of a worker binary's `main`: a panic exits with 101, logs go to stderr
/// (`RUST_LOG`, `warn` by default), settings that do not parse exit with 2, and `run`'s
/// outcome is printed: its report on stdout (exit 0) or its error on stderr (exit 1).
pub async fn worker_main<R, F>(bin: &str, run: impl FnOnce(WorkerSettings) -> F) -> ExitCode
where
    R: fmt::Debug,
    F: Future<Output = outbox_core::Result<R>>,
{
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(101);
    }));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let settings = match WorkerSettings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("{bin}: {e}");
            return ExitCode::from(2);
        }
    };
    let worker = settings.worker.clone();
    match run(settings).await {
        Ok(report) => {
            println!("{bin} {worker} stopped: {report:?}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{bin} {worker} failed: {}", e.report());
            ExitCode::FAILURE
        }
    }
}

/// Wait until stdin reaches its end, or SIGTERM or SIGINT arrives; says which. `bin`
/// names the worker in the message printed when SIGTERM cannot be watched.
pub async fn stop_requested(bin: &str) -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (closed, stdin_closed) = tokio::sync::oneshot::channel();
    // A plain thread: a blocked read must not keep the runtime from shutting down.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("{bin}: cannot watch SIGTERM: {e}");
            return "no SIGTERM handler";
        }
    };
    tokio::select! {
        _ = stdin_closed => "stdin closed",
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_relay_config_validates() {
        let config = relay_config("chaos");
        config.validate().unwrap();
        assert_eq!(config.batch_size, BATCH_SIZE);
        assert_eq!(config.publish_waves(), 1);
    }

    #[test]
    fn published_ddl_quotes_the_schema() {
        assert!(published_ddl("obx_1_ab").contains("\"obx_1_ab\".published"));
    }
}
