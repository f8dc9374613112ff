//! A log-tailing relay worker process for the chaos tests: one
//! [`WalRelay`] over a schema's slot (see
//! [`outbox_chaos::wal_outbox_config`]), publishing into `<schema>.published` with
//! [`TablePublisher`].
//!
//! Settings come from the environment, as for `chaos-worker` (`OUTBOX_CHAOS_PG_URL`,
//! `OUTBOX_CHAOS_SCHEMA`, `OUTBOX_CHAOS_WORKER`); the slot must be installed. The
//! worker runs until its stdin closes, SIGTERM or SIGINT, then stops the relay and
//! exits 0; it exits 1 when the relay stops on its own with an error (an invalidated
//! slot), 101 on a panic.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox_chaos::{
    storage_error, wal_outbox_config, wal_relay_config, TablePublisher, WorkerSettings,
};
use outbox_postgres_wal::{ReplicationTarget, WalOutbox, WalRelay, WalRelayReport};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    outbox_chaos::worker_main("chaos-wal-worker", run).await
}

async fn run(settings: WorkerSettings) -> outbox_core::Result<WalRelayReport> {
    let options: PgConnectOptions = settings
        .url
        .parse()
        .map_err(|e| storage_error("parsing the PostgreSQL URL", e))?;
    let pool = PgPoolOptions::new()
        .max_connections(settings.pool_size)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options.application_name(&format!("outbox-chaos-{}", settings.worker)));
    // Validates the schema name before the publisher formats it into SQL.
    let outbox = WalOutbox::new(pool.clone(), wal_outbox_config(&settings.schema))?;
    let publisher = TablePublisher::new(pool, &settings.schema, settings.worker.as_str());
    let relay = WalRelay::new(
        outbox,
        ReplicationTarget::from_url(&settings.url)?,
        Arc::new(publisher),
        wal_relay_config(),
    )?;
    let stop = CancellationToken::new();
    let mut running = tokio::spawn(relay.run(stop.clone()));
    println!("chaos-wal-worker {} running: {settings:?}", settings.worker);
    tokio::select! {
        why = outbox_chaos::stop_requested("chaos-wal-worker") => {
            println!("chaos-wal-worker {}: {why}, shutting down", settings.worker);
            stop.cancel();
            running.await.map_err(|e| outbox_core::Error::new(outbox_core::ErrorKind::Panicked, e.to_string()))?
        }
        ended = &mut running => {
            ended.map_err(|e| outbox_core::Error::new(outbox_core::ErrorKind::Panicked, e.to_string()))?
        }
    }
}
