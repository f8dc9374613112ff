//! A DynamoDB Streams relay worker process for the chaos tests: one [`StreamRelay`]
//! over the `StreamOutbox` in table `OUTBOX_CHAOS_TABLE` at
//! `OUTBOX_CHAOS_DYNAMODB_URL`, publishing into `<schema>.published` on PostgreSQL
//! with [`TablePublisher`].
//!
//! Settings come from the environment, as for `chaos-worker`; the tables must be
//! installed. The worker prints its lease-table id at start
//! (`chaos-streams-worker <name> lease owner <id>`), runs until its stdin closes,
//! SIGTERM or SIGINT, then shuts the relay down (checkpoint, leases given up) and exits
//! 0; it exits 1 when the relay stops on its own with an error, 101 on a panic.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox_chaos::{storage_error, streams, TablePublisher, WorkerSettings, ENV_DYNAMODB_URL};
use outbox_core::backend::validate_identifier;
use outbox_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use outbox_dynamodb_streams::{StreamOutbox, StreamRelay, StreamRelayReport};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    outbox_chaos::worker_main("chaos-streams-worker", run).await
}

async fn run(settings: WorkerSettings) -> outbox_core::Result<StreamRelayReport> {
    let Some(url) = settings.dynamodb_url.clone() else {
        return Err(outbox_core::Error::config(format!(
            "{ENV_DYNAMODB_URL} is not set"
        )));
    };
    // Checked before the publisher formats it into SQL.
    validate_identifier("schema", &settings.schema, 63)?;
    let options: PgConnectOptions = settings
        .url
        .parse()
        .map_err(|e| storage_error("parsing the PostgreSQL URL", e))?;
    let pool = PgPoolOptions::new()
        .max_connections(settings.pool_size)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options.application_name(&format!("outbox-chaos-{}", settings.worker)));
    let client = outbox_chaos::dynamodb::client(&url, RetryConfig::standard());
    let outbox = StreamOutbox::new(client, streams::outbox_config(&settings.table))?;
    let publisher = TablePublisher::new(pool, &settings.schema, settings.worker.as_str());
    let relay = StreamRelay::new(
        outbox,
        streams::client(&url),
        Arc::new(publisher),
        streams::relay_config(&settings.worker),
    )?;
    println!(
        "chaos-streams-worker {} lease owner {}",
        settings.worker,
        relay.worker_id()
    );
    let stop = CancellationToken::new();
    let mut running = tokio::spawn(relay.run(stop.clone()));
    println!(
        "chaos-streams-worker {} running: {settings:?}",
        settings.worker
    );
    let panicked = |e: tokio::task::JoinError| {
        outbox_core::Error::new(outbox_core::ErrorKind::Panicked, e.to_string())
    };
    tokio::select! {
        why = outbox_chaos::stop_requested("chaos-streams-worker") => {
            println!("chaos-streams-worker {}: {why}, shutting down", settings.worker);
            stop.cancel();
            running.await.map_err(panicked)?
        }
        ended = &mut running => ended.map_err(panicked)?,
    }
}
