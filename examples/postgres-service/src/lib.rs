//! An HTTP order service on PostgreSQL, built the way a production service would wire
//! the outbox:
//!
//! - `POST /orders` with `{"customer": "ada", "amount_cents": 1250}` validates the body
//!   (a bad one gets a 4xx with an `{"error": ...}` body and nothing is written),
//!   inserts the order row **and** its `orders.created` message in one transaction,
//!   commits, dispatches that message by id right after the commit
//!   ([`Relay::dispatch_ids`]) and answers `201` with both ids ([`OrderCreated`]);
//! - a background relay ([`Relay::spawn`]) sweeps whatever the dispatch after commit
//!   did not publish (a broker error, a crash between commit and dispatch);
//! - `GET /metrics` renders the relay's `outbox_*` counters and the outbox stats gauges
//!   ([`StatsReporter`]) as Prometheus text; `GET /healthz` checks the database;
//! - shutdown drains HTTP first (requests in flight finish their dispatch), then stops
//!   the relay, which releases the leases it holds.
//!
//! The "broker" is [`InProcessBroker`], which logs and keeps what it was given; any
//! [`outbox::Publisher`] fits in its place, such as `outbox::nats::NatsPublisher`
//! or `outbox::rabbitmq::RabbitPublisher` (features `nats`, `rabbitmq`).
//!
//! The binary (`src/main.rs`) is a thin wrapper: it connects to `OUTBOX_PG_URL`, calls
//! [`install`], [`metrics_recorder`] and [`build`], and serves until Ctrl-C. Run it from
//! the repository root:
//!
//! ```sh
//! eval "$(scripts/services.sh)" && cargo run -p example-postgres-service
//! # in another shell:
//! curl -si -H 'content-type: application/json' \
//!      -d '{"customer":"ada","amount_cents":1250}' http://127.0.0.1:3000/orders
//! curl -s http://127.0.0.1:3000/metrics | grep outbox_
//! ```
//!
//! `tests/http.rs` drives the same [`App`] over real HTTP on `127.0.0.1:0`.

mod broker;
mod orders;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox::postgres::sqlx::{self, PgPool};
use outbox::postgres::{PgOutbox, PgOutboxConfig, QualifiedName};
use outbox::{
    DispatchReport, Error, ErrorKind, Relay, RelayConfig, RelayHandle, Result, StatsReporter,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use broker::InProcessBroker;
pub use orders::{
    ApiError, NewOrder, OrderCreated, MAX_AMOUNT_CENTS, MAX_CUSTOMER_CHARS, ORDER_CREATED,
};

/// The service's own table, in the same schema as the outbox.
pub const ORDERS_TABLE: &str = "orders";

/// How often the Prometheus recorder drains histograms when nobody scrapes.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Where the service keeps its tables and how its relay runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The schema of both the orders table and the outbox (default `shop`): a
    /// validated identifier (`a-z`, `0-9`, `_`).
    pub schema: String,
    /// The relay's settings; its [`name`](RelayConfig::name) labels the relay's metrics
    /// (default `orders`).
    pub relay: RelayConfig,
    /// How often the outbox stats gauges are refreshed (default 15 s).
    pub stats_interval: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            schema: "shop".to_owned(),
            relay: RelayConfig::default().with_name("orders"),
            stats_interval: Duration::from_secs(15),
        }
    }
}

impl ServiceConfig {
    fn outbox(&self) -> PgOutboxConfig {
        PgOutboxConfig::default().with_schema(self.schema.clone())
    }

    fn orders(&self) -> Result<QualifiedName> {
        QualifiedName::new(self.schema.clone(), ORDERS_TABLE)
    }
}

fn db_error(what: &str, e: sqlx::Error) -> Error {
    Error::new(ErrorKind::Storage, format!("{what} failed")).with_source(e)
}

/// The orders table: the row names its `orders.created` message, so either can be
/// traced to the other.
fn orders_ddl(orders: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {orders} (\n    \
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n    \
             customer text NOT NULL,\n    \
             amount_cents bigint NOT NULL CHECK (amount_cents > 0),\n    \
             message_id uuid NOT NULL UNIQUE,\n    \
             created_at timestamptz NOT NULL DEFAULT now()\n\
         )"
    )
}

/// Create the outbox (schema, table, indexes: [`PgOutbox::install`]) and the orders
/// table in `config.schema`, if missing. Safe to run at every start-up; a real service
/// would apply the same DDL with its migrations.
///
/// # Errors
/// [`ErrorKind::Config`] for a bad schema name; the install's or the driver's error.
pub async fn install(pool: &PgPool, config: &ServiceConfig) -> Result<()> {
    let orders = config.orders()?;
    PgOutbox::new(pool.clone(), config.outbox())?
        .install()
        .await?;
    // The name is validated and quoted by `QualifiedName`; the DDL has no values.
    sqlx::raw_sql(&orders_ddl(&orders))
        .execute(pool)
        .await
        .map_err(|e| db_error("creating the orders table", e))?;
    Ok(())
}

/// The process's Prometheus recorder: installed as the global `metrics` recorder on
/// the first call (with [`describe_metrics`](outbox::monitor::describe_metrics)'
/// help texts), the same handle on later calls.
///
/// Call it **before** [`build`]: a relay takes its metric handles when it is created,
/// so a relay created before the recorder records nowhere.
///
/// # Errors
/// [`ErrorKind::Config`] when another global recorder was installed first.
pub fn metrics_recorder() -> Result<PrometheusHandle> {
    static HANDLE: OnceLock<std::result::Result<PrometheusHandle, String>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| e.to_string())?;
            outbox::monitor::describe_metrics();
            Ok(handle)
        })
        .clone()
        .map_err(|e| Error::config(format!("installing the Prometheus recorder failed: {e}")))
}

/// The service, built and running its background tasks, ready to [`serve`](Self::serve).
///
/// Dropping it without serving stops the relay and the stats reporter too.
#[derive(Debug)]
pub struct App {
    router: axum::Router,
    relay: Relay,
    running: RelayHandle,
    broker: Arc<InProcessBroker>,
    outbox: PgOutbox,
    background: Vec<JoinHandle<()>>,
    /// Cancels the relay, the stats reporter and the metrics upkeep when dropped.
    stop: DropGuard,
}

/// Build the service on `pool` (after [`install`]): start its relay, its stats
/// reporter and the recorder's upkeep, and route requests to handlers that share them.
/// `metrics` is the handle `/metrics` renders ([`metrics_recorder`]).
///
/// Must be called within a Tokio runtime: it spawns the background tasks.
///
/// # Errors
/// [`ErrorKind::Config`] for a bad schema name or relay config.
pub fn build(pool: PgPool, config: &ServiceConfig, metrics: PrometheusHandle) -> Result<App> {
    let outbox = PgOutbox::new(pool.clone(), config.outbox())?;
    let orders = config.orders()?;
    let broker = Arc::new(InProcessBroker::default());
    let stop = CancellationToken::new();
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        broker.clone(),
        config.relay.clone(),
    )?
    .with_shutdown(stop.clone().cancelled_owned());
    let running = relay.spawn();

    let label = format!("{}.{}", outbox.config().schema(), outbox.config().table());
    let stats = StatsReporter::new(Arc::new(outbox.clone()), label)
        .with_interval(config.stats_interval)
        .spawn(stop.clone().cancelled_owned());
    let upkeep = tokio::spawn({
        let (metrics, stop) = (metrics.clone(), stop.clone());
        async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => metrics.run_upkeep(),
                }
            }
        }
    });

    let router = orders::router(orders::AppState {
        pool,
        outbox: outbox.clone(),
        orders,
        relay: relay.clone(),
        metrics,
    });
    Ok(App {
        router,
        relay,
        running,
        broker,
        outbox,
        background: vec![stats, upkeep],
        stop: stop.drop_guard(),
    })
}

impl App {
    /// The routes, for serving them yourself or nesting them in a larger router.
    pub fn router(&self) -> axum::Router {
        self.router.clone()
    }

    /// The relay, for [`Relay::wait_idle`], [`Relay::report`] and friends.
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// The broker the relay publishes to.
    pub fn broker(&self) -> &Arc<InProcessBroker> {
        &self.broker
    }

    /// The outbox, for [`OutboxAdmin`](outbox::OutboxAdmin) calls.
    pub fn outbox(&self) -> &PgOutbox {
        &self.outbox
    }

    /// Serve HTTP on `listener` until `shutdown` resolves, then stop in order:
    ///
    /// 1. stop accepting connections and let requests in flight finish (each one's
    ///    dispatch after commit included);
    /// 2. stop the relay ([`RelayHandle::shutdown`]): it claims nothing more, releases
    ///    the leases of publishes not started and gives those in flight their grace;
    /// 3. stop the stats reporter and the metrics upkeep.
    ///
    /// Returns the relay's totals.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when serving failed; the relay's shutdown error
    /// ([`ErrorKind::Panicked`]). Either way, everything was stopped first.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<DispatchReport> {
        let App {
            router,
            running,
            background,
            stop,
            ..
        } = self;
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await;
        let totals = running.shutdown().await;
        drop(stop);
        for task in background {
            // They end at the cancellation; a panic was logged where it happened.
            let _ = task.await;
        }
        served.map_err(|e| {
            Error::new(ErrorKind::Unavailable, "serving HTTP failed").with_source(e)
        })?;
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_ddl_quotes_the_validated_name() {
        let config = ServiceConfig {
            schema: "billing".to_owned(),
            ..ServiceConfig::default()
        };
        let ddl = orders_ddl(&config.orders().expect("valid"));
        assert!(
            ddl.starts_with(r#"CREATE TABLE IF NOT EXISTS "billing"."orders" ("#),
            "{ddl}"
        );
    }

    #[test]
    fn bad_schema_names_are_refused_before_any_sql() {
        for schema in ["", "Shop", "shop; DROP TABLE x", "a.b", "1shop"] {
            let config = ServiceConfig {
                schema: schema.to_owned(),
                ..ServiceConfig::default()
            };
            let err = config.orders().expect_err(schema);
            assert_eq!(err.kind(), ErrorKind::Config, "{schema}");
        }
    }
}
