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
//! The schema (outbox table and `published`) must already be installed. The worker runs
//! until its stdin closes, SIGTERM or SIGINT, then shuts the relay down gracefully and
//! exits 0; SIGKILL is the crash the tests inflict. A panic anywhere (for example in the
//! relay's task) ends the process at once with status 101, so it cannot linger without
//! a relay. Logs go to stderr (`RUST_LOG`, default `warn`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox_chaos::{relay_config, storage_error, TablePublisher, WorkerSettings};
use outbox_core::{DispatchReport, OutboxStore, Relay};
use outbox_mysql::{MySqlOutbox, MySqlOutboxConfig};
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
    // Validates the schema name before the publisher formats it into SQL.
    let outbox: Arc<dyn OutboxStore> = match &settings.mysql_url {
        None => Arc::new(PgOutbox::new(pool.clone(), config)?),
        Some(url) => {
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
            Arc::new(MySqlOutbox::new(mysql, config)?)
        }
    };
    let publisher = TablePublisher::new(pool, &settings.schema, settings.worker.as_str());
    let relay = Relay::new(outbox, Arc::new(publisher), relay_config(&settings.worker))?;
    let handle = relay.spawn();
    println!("chaos-worker {} running: {settings:?}", settings.worker);
    let why = outbox_chaos::stop_requested("chaos-worker").await;
    println!("chaos-worker {}: {why}, shutting down", settings.worker);
    handle.shutdown().await
}
