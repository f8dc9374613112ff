//! A service writing orders and their events in one PostgreSQL transaction, a relay
//! woken by `NOTIFY` publishing them, an explicit dispatch right after commit, and a
//! consumer deduplicating with the inbox table inside its own transaction.
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
use outbox_core::{
    Dedup, Message, NewMessage, OutboxStore, PublishOutcome, Publisher, Relay, RelayConfig, Result,
};
use outbox_postgres::{spawn_listener, PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig};
use sqlx::PgPool;

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

fn db_error(e: sqlx::Error) -> outbox_core::Error {
    outbox_core::Error::new(outbox_core::ErrorKind::Storage, "example SQL failed").with_source(e)
}

/// The business write and its event, committed together.
async fn place_order(pool: &PgPool, outbox: &PgOutbox, order: i64) -> Result<NewMessage> {
    let mut tx = pool.begin().await.map_err(db_error)?;
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
    outbox
        .enqueue(&mut tx, std::slice::from_ref(&event))
        .await?;
    tx.commit().await.map_err(db_error)?;
    Ok(event)
}

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".to_owned());
    let pool = PgPool::connect(&url).await.map_err(db_error)?;
    sqlx::query("DROP SCHEMA IF EXISTS example_shop CASCADE")
        .execute(&pool)
        .await
        .map_err(db_error)?;
    sqlx::query("CREATE SCHEMA example_shop")
        .execute(&pool)
        .await
        .map_err(db_error)?;
    sqlx::query(
        "CREATE TABLE example_shop.orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .map_err(db_error)?;

    let outbox = PgOutbox::new(
        pool.clone(),
        PgOutboxConfig::default()
            .schema("example_shop")
            // NOTIFY wakes relays in other processes at once, at the price of a
            // cluster-wide lock at each notifying commit; see `notify_on_commit`.
            .notify_on_commit(),
    )?;
    outbox.install().await?;
    let inbox = PgDedupStore::new(
        pool.clone(),
        PgDedupConfig::default().schema("example_shop"),
    )?;
    inbox.install().await?;

    let broker = Arc::new(InProcessBroker::default());
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        broker.clone(),
        RelayConfig::default().name("shop"),
    )?;
    let channel = outbox.config().notify_channel().expect("notify is on");
    let listener = spawn_listener(pool.clone(), channel, relay.wakeup())?;
    let running = relay.spawn();

    // Orders 1-3: the NOTIFY issued inside each transaction wakes the relay on commit.
    for order in 1..=3 {
        place_order(&pool, &outbox, order).await?;
    }
    // Order 4: dispatch explicitly right after commit, alongside the background relay.
    let event = place_order(&pool, &outbox, 4).await?;
    let report = relay.dispatch_ids(&[event.id()]).await?;
    println!(
        "explicit dispatch of order 4: {} published",
        report.dispatched
    );

    relay.wait_idle(Duration::from_secs(10)).await?;
    let totals = running.shutdown().await?;
    listener.stop().await;
    println!("relay totals: {totals:?}");
    println!("outbox now: {:?}", outbox.stats().await?);

    // A consumer: the broker redelivers everything once; the inbox, written in the
    // consumer's own transaction, makes the second delivery a no-op.
    let deliveries = broker
        .delivered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for m in deliveries.iter().chain(deliveries.iter()) {
        let mut tx = pool.begin().await.map_err(db_error)?;
        match inbox.record_in(&mut tx, "billing", m.id).await? {
            Dedup::New => println!("billing handles {}", m.id),
            Dedup::Duplicate => println!("billing skips duplicate {}", m.id),
        }
        // ... the handler's own writes on &mut *tx go here ...
        tx.commit().await.map_err(db_error)?;
    }
    Ok(())
}
