//! A service writing orders and their events in one PostgreSQL transaction: after each
//! commit it wakes its relay in process (no `NOTIFY`, so commits stay independent),
//! dispatches one order's event by id right after commit, reads the outbox's stats as
//! an operator would, stops the relay with its shutdown signal, and runs a consumer
//! that deduplicates with the inbox table inside its own transaction.
//!
//! Run it against any PostgreSQL you may create schemas in:
//!
//! ```sh
//! eval "$(scripts/services.sh)"   # or export OUTBOX_PG_URL=postgres://...
//! cargo run -p example-postgres-relay
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox::postgres::sqlx::{self, PgPool};
use outbox::postgres::{PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig};
use outbox::{
    ConsumerName, Dedup, Message, NewMessage, OutboxAdmin, PublishOutcome, Publisher, Relay,
    RelayConfig, Result,
};
use tokio_util::sync::CancellationToken;

/// Stands in for a broker client: keeps what it was given so the consumer below can
/// read it, and prints each message.
#[derive(Debug, Default)]
struct InProcessBroker {
    delivered: Mutex<Vec<Message>>,
}

#[async_trait]
impl Publisher for InProcessBroker {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let mut delivered = self.delivered.lock().unwrap_or_else(|p| p.into_inner());
        for m in batch {
            println!(
                "broker <- {} {} {}",
                m.destination,
                m.id,
                String::from_utf8_lossy(&m.payload)
            );
            delivered.push(m.clone());
        }
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

fn db_error(e: sqlx::Error) -> outbox::Error {
    outbox::Error::new(outbox::ErrorKind::Storage, "example SQL failed").with_source(e)
}

/// What a request handler holds: the pool, the outbox and the relay to wake.
#[derive(Debug, Clone)]
struct Shop {
    pool: PgPool,
    outbox: PgOutbox,
    relay: Relay,
}

impl Shop {
    /// The business write and its event, committed together; then the relay is woken
    /// so the event is published now rather than at its next poll.
    async fn place_order(&self, order: i64) -> Result<NewMessage> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        sqlx::query("INSERT INTO example_shop.orders (id, total_cents) VALUES ($1, $2)")
            .bind(order)
            .bind(order * 1000)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        let event = NewMessage::builder("orders.placed")
            .partition_key(format!("order-{order}"))
            .content_type("application/json")
            .payload(format!("{{\"order\":{order}}}"))
            .build()?;
        self.outbox
            .enqueue(&mut tx, std::slice::from_ref(&event))
            .await?;
        tx.commit().await.map_err(db_error)?;
        self.relay.wakeup().wake();
        Ok(event)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".to_owned());
    let pool = PgPool::connect(&url).await.map_err(db_error)?;
    sqlx::raw_sql(
        "DROP SCHEMA IF EXISTS example_shop CASCADE; \
         CREATE SCHEMA example_shop; \
         CREATE TABLE example_shop.orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL);",
    )
    .execute(&pool)
    .await
    .map_err(db_error)?;

    // NOTIFY stays off (the default): this process wakes its own relay after each
    // commit, and relays elsewhere would find the messages at their next poll.
    let outbox = PgOutbox::new(
        pool.clone(),
        PgOutboxConfig::default().with_schema("example_shop"),
    )?;
    outbox.install().await?;
    let inbox = PgDedupStore::new(
        pool.clone(),
        PgDedupConfig::default().with_schema("example_shop"),
    )?;
    inbox.install().await?;

    // The service's shutdown tree: cancelling it stops the relay.
    let shutdown = CancellationToken::new();
    let broker = Arc::new(InProcessBroker::default());
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        broker.clone(),
        RelayConfig::default().with_name("shop"),
    )?
    .with_shutdown(shutdown.clone().cancelled_owned());
    let running = relay.spawn();
    let shop = Shop {
        pool: pool.clone(),
        outbox: outbox.clone(),
        relay: relay.clone(),
    };

    // Orders 1-3: each commit wakes the relay.
    for order in 1..=3 {
        shop.place_order(order).await?;
    }
    // Order 4: dispatch explicitly right after commit, alongside the background relay.
    let event = shop.place_order(4).await?;
    let report = relay.dispatch_ids(&[event.id()]).await?;
    println!(
        "explicit dispatch of order 4: {} published",
        report.dispatched
    );

    relay.wait_idle(Duration::from_secs(10)).await?;
    println!("outbox now: {:?}", outbox.stats().await?);
    shutdown.cancel();
    let totals = running.shutdown().await?;
    println!("relay totals: {totals:?}");

    // A consumer: the broker redelivers everything once; the inbox, written in the
    // consumer's own transaction, makes the second delivery a no-op.
    let billing = ConsumerName::new("billing")?;
    let deliveries = broker
        .delivered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for m in deliveries.iter().chain(deliveries.iter()) {
        let mut tx = pool.begin().await.map_err(db_error)?;
        match inbox.record_in(&mut tx, &billing, m.id).await? {
            Dedup::New => println!("billing handles {}", m.id),
            Dedup::Duplicate => println!("billing skips duplicate {}", m.id),
        }
        // ... the handler's own writes on &mut *tx go here ...
        tx.commit().await.map_err(db_error)?;
    }
    Ok(())
}
