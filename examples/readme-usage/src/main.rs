//! The root README's usage block ("Using it"), compiled and run: a PostgreSQL outbox
//! installed, a relay spawned with a shutdown token, an order and its
//! `orders.created` message written in one transaction, the message dispatched by id
//! right after the commit, and the relay shut down. It exits 0 once the message it
//! enqueued was published, 1 otherwise (2 when `OUTBOX_PG_URL` is not set).
//!
//! Run it against any PostgreSQL you may create schemas in:
//!
//! ```sh
//! eval "$(scripts/services.sh)"   # or export OUTBOX_PG_URL=postgres://...
//! cargo run -p example-readme-usage
//! ```
//!
//! The lines between the `README: usage` markers below are the README's block,
//! verbatim; everything else here is what the block takes as given (`pool`,
//! `my_publisher`, `shutdown_token`, `order_id`, `total`, `event`).
//! `cargo test -p outbox-core --test readme_usage` fails when the two differ. The
//! outbox goes where `PgOutboxConfig::default()` puts it (the schema `outbox`); the
//! `orders` table is made in a schema of its own, `readme_usage`, the connections'
//! search path.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Mutex;

use async_trait::async_trait;
use outbox::postgres::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use outbox::{Message, MessageId, PublishOutcome, Publisher};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The schema of the example's `orders` table (the connections' search path).
const SCHEMA: &str = "readme_usage";

/// Stands in for a broker client: prints each message and keeps its id, shared with
/// its clones, so `main` can check the one it enqueued was published.
#[derive(Debug, Clone, Default)]
struct MyPublisher {
    published: std::sync::Arc<Mutex<Vec<MessageId>>>,
}

impl MyPublisher {
    fn published(&self) -> Vec<MessageId> {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl Publisher for MyPublisher {
    async fn publish(&self, batch: &[Message]) -> outbox::Result<Vec<PublishOutcome>> {
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        for m in batch {
            println!(
                "broker <- {} {} {}",
                m.destination,
                m.id,
                String::from_utf8_lossy(&m.payload)
            );
            published.push(m.id);
        }
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let Some(url) = std::env::var("OUTBOX_PG_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
    else {
        eprintln!(
            "readme-usage: OUTBOX_PG_URL is not set: run `eval \"$(scripts/services.sh)\"` \
             first, or export OUTBOX_PG_URL=postgres://user@host:5432/database"
        );
        return ExitCode::from(2);
    };
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("readme-usage: {err}");
            let mut source = err.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// The setup the README's block takes as given, the block, then the check.
async fn run(url: &str) -> Result<(), Box<dyn Error>> {
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("search_path", SCHEMA)]))
        .await?;
    outbox::postgres::sqlx::raw_sql(&format!(
        "CREATE SCHEMA IF NOT EXISTS {SCHEMA}; \
         CREATE TABLE IF NOT EXISTS {SCHEMA}.orders (id uuid PRIMARY KEY, total bigint NOT NULL);"
    ))
    .execute(&pool)
    .await?;

    let my_publisher = MyPublisher::default();
    let broker = my_publisher.clone();
    let shutdown_token = CancellationToken::new();
    let order_id = Uuid::now_v7();
    let total: i64 = 4200;
    let event = serde_json::json!({ "order_id": order_id, "total_cents": total });

    let id = usage(pool, my_publisher, shutdown_token, order_id, total, event).await?;

    if broker.published().contains(&id) {
        println!("readme-usage: order {order_id}: message {id} published");
        Ok(())
    } else {
        Err(format!("message {id} was enqueued but not published").into())
    }
}

/// The README's block, in a function of its own so that its lines can stay as the
/// README shows them (`rustfmt::skip`: rustfmt would reflow them).
#[rustfmt::skip]
async fn usage(
    pool: PgPool,
    my_publisher: MyPublisher,
    shutdown_token: CancellationToken,
    order_id: Uuid,
    total: i64,
    event: serde_json::Value,
) -> Result<MessageId, Box<dyn Error>> {
    // README: usage begin
    use std::sync::Arc;

    use outbox::postgres::{sqlx, PgOutbox, PgOutboxConfig};
    use outbox::{NewMessage, Relay, RelayConfig};

    // Per-key order is opt-in: .with_ordering(outbox::KeyOrder::PerKey)
    let store = PgOutbox::new(pool.clone(), PgOutboxConfig::default())?;
    store.install().await?; // or apply outbox-postgres/sql/outbox.sql with your migration tool

    // Once per process: a relay moving messages to your broker, stopped by the service's
    // shutdown token together with everything else.
    let relay = Relay::new(Arc::new(store.clone()), Arc::new(my_publisher), RelayConfig::default())?
        .with_shutdown(shutdown_token.clone().cancelled_owned());
    let handle = relay.spawn();

    // In your request handler: business write and message in ONE transaction.
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)")
        .bind(order_id).bind(total).execute(&mut *tx).await?;
    let msg = NewMessage::builder("orders.created")
        .partition_key(order_id.to_string())
        .content_type("application/json")
        .payload(serde_json::to_vec(&event)?)
        .build()?;
    let id = msg.id();
    store.enqueue(&mut tx, &[msg]).await?; // never commits for you
    tx.commit().await?;
    relay.dispatch_ids(&[id]).await?; // publish now, not at the next poll (or relay.wakeup().wake())

    // At shutdown: stop the relay and wait for it (cancelling the token stops it too).
    handle.shutdown().await?;
    // README: usage end
    Ok(id)
}
