//! The relay engine with no database: the in-memory reference store, a publisher that
//! prints, a broker that fails now and then, retries, a dead letter, and a graceful
//! shutdown.
//!
//! Run it with:
//!
//! ```sh
//! cargo run -p example-in-memory
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox::testkit::MemoryStore;
use outbox::{
    DeadLetterFilter, DeadLetterPage, Message, NewMessage, OutboxAdmin, PublishOutcome, Publisher,
    Relay, RelayConfig, Result, RetryPolicy,
};

/// Prints what it publishes; every third call fails (retryable), and messages to
/// `audit.bogus` are refused for good.
#[derive(Debug, Default)]
struct FlakyPrinter {
    calls: AtomicU32,
}

#[async_trait]
impl Publisher for FlakyPrinter {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(batch
            .iter()
            .map(|m| {
                if m.destination == "audit.bogus" {
                    PublishOutcome::Permanent("no such topic".into())
                } else if call.is_multiple_of(3) {
                    println!("  broker hiccup on {} (attempt {})", m.id, m.attempts);
                    PublishOutcome::Retryable("broker hiccup".into())
                } else {
                    let body = String::from_utf8_lossy(&m.payload);
                    println!(
                        "published {} to {}: {body} (attempt {})",
                        m.id, m.destination, m.attempts
                    );
                    PublishOutcome::Published
                }
            })
            .collect())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let store = MemoryStore::new();

    // A "transaction": nothing is visible until commit.
    let mut tx = store.begin();
    for n in 1..=5 {
        tx.enqueue(
            NewMessage::builder("orders.created")
                .content_type("application/json")
                .payload(format!("{{\"order\":{n}}}"))
                .build()?,
        )?;
    }
    tx.enqueue(NewMessage::builder("audit.bogus").payload("?").build()?)?;
    tx.commit()?;

    let config = RelayConfig::default()
        .with_batch_size(2)
        .with_publish_batch_size(2)
        .with_publish_concurrency(1)
        .with_retry(
            RetryPolicy::new(5)
                .with_initial_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_millis(100)),
        );
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(FlakyPrinter::default()),
        config,
    )?;
    let handle = relay.spawn();
    handle.wake();

    // Wait until everything due is handled (retries back off briefly).
    while store.stats().await?.pending + store.stats().await?.in_flight > 0 {
        relay.wait_idle(Duration::from_secs(5)).await?;
    }
    let report = handle.shutdown().await?;
    println!(
        "dispatched {}, retried {}, dead-lettered {}",
        report.dispatched, report.retried, report.dead_lettered
    );
    let page = DeadLetterPage::new(DeadLetterFilter::default(), 10)?;
    for dead in store.dead_letters(&page).await? {
        let m = &dead.message;
        println!(
            "dead letter {} to {}: {:?}",
            m.id, m.destination, m.last_error
        );
    }
    Ok(())
}
