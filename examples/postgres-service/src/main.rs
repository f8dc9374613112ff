//! An HTTP order service on PostgreSQL: `POST /orders` writes the order and its
//! `orders.created` message in one transaction and dispatches the message right after
//! commit, a background relay sweeps the rest, `GET /metrics` shows the relay's and the
//! outbox's metrics as Prometheus text, and Ctrl-C (or SIGTERM) drains HTTP, then stops
//! the relay. The broker is an in-process stand-in that logs what it is given; the
//! facade's `outbox::nats` and `outbox::rabbitmq` publishers (features `nats`,
//! `rabbitmq`) fit in its place. The library (`src/lib.rs`) documents the pieces.
//!
//! Run it from the repository root against any PostgreSQL you may create schemas in
//! (`OUTBOX_PG_URL` is required; `LISTEN_ADDR` defaults to `127.0.0.1:3000`, `RUST_LOG`
//! to `info`):
//!
//! ```sh
//! eval "$(scripts/services.sh)" && cargo run -p example-postgres-service
//! # in another shell:
//! curl -si -H 'content-type: application/json' \
//!      -d '{"customer":"ada","amount_cents":1250}' http://127.0.0.1:3000/orders
//! curl -s http://127.0.0.1:3000/metrics | grep outbox_
//! ```

use example_postgres_service::{build, install, metrics_recorder, ServiceConfig};
use outbox::postgres::sqlx::PgPool;
use tracing_subscriber::EnvFilter;

const DEFAULT_LISTEN_ADDR: &str = "127.0.0.1:3000";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let url = std::env::var("OUTBOX_PG_URL").map_err(|_| {
        "OUTBOX_PG_URL is not set: run `eval \"$(scripts/services.sh)\"` from the repository \
         root, or export a postgres:// URL"
    })?;
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| DEFAULT_LISTEN_ADDR.to_owned());

    // Before `build`: the relay takes its metric handles when it is created.
    let metrics = metrics_recorder()?;
    let config = ServiceConfig::default();
    let pool = PgPool::connect(&url).await?;
    install(&pool, &config).await?;
    let app = build(pool.clone(), &config, metrics)?;

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    tracing::info!(
        "listening on http://{}: POST /orders, GET /metrics, GET /healthz",
        listener.local_addr()?
    );
    let totals = app.serve(listener, shutdown_signal()).await?;
    tracing::info!(?totals, "stopped");
    pool.close().await;
    Ok(())
}

/// Resolves on Ctrl-C, or on SIGTERM (what orchestrators send) on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: draining HTTP, then stopping the relay");
}
