//! A relay worker process for the chaos tests: one [`Relay`] over an installed outbox
//! schema, publishing into `<schema>.published` with [`TablePublisher`].
//!
//! Settings come from the environment (see the `ENV_*` constants of `outbox_chaos`):
//!
//! ```sh
//! OUTBOX_CHAOS_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test \
//! OUTBOX_CHAOS_SCHEMA=obx_1700000000_0123456789ab OUTBOX_CHAOS_WORKER=w1 \
//! OUTBOX_CHAOS_PER_KEY=1 cargo run -p outbox-chaos --bin chaos-worker
//! ```
//!
//! With `OUTBOX_CHAOS_HELD_LOCK=1` the PostgreSQL outbox claims with held locks
//! (`ClaimMode::HeldLock`).
//!
//! With `OUTBOX_CHAOS_CRASH_ON=<destination>` the worker aborts (SIGABRT) when its relay
//! publishes a message to that destination; `OUTBOX_CHAOS_MAX_ATTEMPTS` sets the relay's
//! `max_attempts`.
//!
//! With `OUTBOX_CHAOS_DYNAMODB_URL` set, the outbox is a `DynamoOutbox` in the table
//! `OUTBOX_CHAOS_TABLE` at that endpoint, its client under the seeded fault mix of
//! `outbox_chaos::dynamodb` (seed `OUTBOX_CHAOS_FAULT_SEED`, random when unset; the
//! worker prints it at start and its fault counts every second); `published` stays on
//! PostgreSQL.
//!
//! The schema (outbox table and `published`) must already be installed. The worker runs
//! until its stdin closes, SIGTERM or SIGINT, then shuts the relay down gracefully and
//! exits 0; SIGKILL is the crash the tests inflict. A panic anywhere (for example in the
//! relay's task) ends the process at once with status 101, so it cannot linger without
//! a relay. Logs go to stderr (`RUST_LOG`, default `warn`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox_chaos::dynamodb::{self, FaultCounts, FAULTS_EVERY, FAULTS_LINE};
use outbox_chaos::{
    storage_error, TablePublisher, WorkerSettings, ENV_DYNAMODB_URL, ENV_FAULT_SEED, ENV_MYSQL_URL,
};
use outbox_core::backend::validate_identifier;
use outbox_core::{ClaimMode, DispatchReport, OutboxStore, Relay};
use outbox_dynamodb::DynamoOutbox;
use outbox_mysql::{MySqlClaimConfig, MySqlOutbox, MySqlOutboxConfig};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    outbox_chaos::worker_main("chaos-worker", run).await
}

async fn run(settings: WorkerSettings) -> outbox_core::Result<DispatchReport> {
    let options: PgConnectOptions = settings
        .url
        .parse()
        .map_err(|e| storage_error("parsing the PostgreSQL URL", e))?;
    // Lazy, so a worker started while the server is down waits for it like a running
    // one does.
    let pool = PgPoolOptions::new()
        .max_connections(settings.pool_size)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options.application_name(&format!("outbox-chaos-{}", settings.worker)));
    let config = PgOutboxConfig::default()
        .with_schema(settings.schema.as_str())
        .with_table(settings.table.as_str())
        .with_ordering(settings.ordering)
        .with_relay_connections(settings.pool_size);
    // One connection per batch the relay holds, one for a dispatch, one spare.
    let depth = settings.relay_config().pipeline_depth;
    let held = u32::try_from(depth + 2).unwrap_or(u32::MAX);
    let config = if settings.held_lock {
        config
            .with_claim_mode(ClaimMode::HeldLock)
            .with_held_connections(held)
    } else {
        config
    };
    // Validates the schema name before the publisher formats it into SQL.
    let outbox: Arc<dyn OutboxStore> = match (&settings.mysql_url, &settings.dynamodb_url) {
        (None, None) => Arc::new(PgOutbox::new(pool.clone(), config)?),
        (Some(_), Some(_)) => {
            return Err(outbox_core::Error::config(format!(
                "set one of {ENV_MYSQL_URL} and {ENV_DYNAMODB_URL}, not both"
            )))
        }
        (Some(url), None) => {
            let options = url
                .parse()
                .map_err(|e| storage_error("parsing the MySQL URL", e))?;
            let mysql = outbox_mysql::sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(settings.pool_size)
                .acquire_timeout(Duration::from_secs(2))
                .connect_lazy_with(options);
            let config = MySqlOutboxConfig::default()
                .with_schema(settings.schema.as_str())
                .with_table(settings.table.as_str())
                .with_ordering(settings.ordering);
            let mode = if settings.held_lock {
                ClaimMode::HeldLock
            } else {
                ClaimMode::Lease
            };
            let claims = MySqlClaimConfig::default()
                .with_claim_mode(mode)
                .with_held_connections(held);
            Arc::new(MySqlOutbox::new(mysql, config)?.with_claims(claims))
        }
        (None, Some(url)) => {
            // No store here formats the schema: check it as the PostgreSQL one would.
            validate_identifier("schema", &settings.schema, 63)?;
            return run_on_dynamodb(url, pool, &settings).await;
        }
    };
    let publisher = TablePublisher::new(pool, &settings.schema, settings.worker.as_str())
        .crash_on(settings.crash_on.clone());
    let relay = Relay::new(outbox, Arc::new(publisher), settings.relay_config())?;
    let handle = relay.spawn();
    println!("chaos-worker {} running: {settings:?}", settings.worker);
    let why = outbox_chaos::stop_requested("chaos-worker").await;
    println!("chaos-worker {}: {why}, shutting down", settings.worker);
    handle.shutdown().await
}

/// The relay over a `DynamoOutbox` at `url` whose client runs under the fault mix of
/// [`dynamodb::fault_mix`]; the seed is printed at start, the fault counts every
/// [`FAULTS_EVERY`] and at the end. On shutdown the worker's shards are released.
async fn run_on_dynamodb(
    url: &str,
    pool: sqlx::PgPool,
    settings: &WorkerSettings,
) -> outbox_core::Result<DispatchReport> {
    let id = settings.worker.as_str();
    let seed = settings.fault_seed.unwrap_or_else(|| fastrand::u64(..));
    println!(
        "chaos-worker {id}: fault injection seed {seed} (replay with {ENV_FAULT_SEED}={seed})"
    );
    let faults = dynamodb::fault_mix(seed);
    let client = faults.client(&dynamodb::client(url, dynamodb::retries()));
    let outbox = DynamoOutbox::new(
        client,
        dynamodb::outbox_config(&settings.table, settings.ordering),
    )?;
    let publisher = TablePublisher::new(pool, &settings.schema, id);
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        Arc::new(publisher),
        dynamodb::relay_config(id),
    )?;
    let handle = relay.spawn();
    println!("chaos-worker {id} running on DynamoDB: {settings:?}");
    let counts = faults.clone();
    let worker = id.to_owned();
    let reporter = tokio::spawn(async move {
        let mut every = tokio::time::interval(FAULTS_EVERY);
        loop {
            every.tick().await;
            println!(
                "chaos-worker {worker} {FAULTS_LINE}{}",
                FaultCounts::of(&counts)
            );
        }
    });
    let why = outbox_chaos::stop_requested("chaos-worker").await;
    println!("chaos-worker {id}: {why}, shutting down");
    let report = handle.shutdown().await;
    reporter.abort();
    if let Err(e) = outbox.release_shards().await {
        eprintln!("chaos-worker {id}: releasing shards failed: {}", e.report());
    }
    println!(
        "chaos-worker {id} {FAULTS_LINE}{}",
        FaultCounts::of(&faults)
    );
    println!("chaos-worker {id}: {faults}");
    report
}
