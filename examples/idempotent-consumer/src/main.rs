//! An account service consuming `payment.requested` messages with the decoupled
//! idempotent-consumer algorithm on PostgreSQL: each message debits an account and
//! sends a `payment.debited` message. Every message is delivered twice, half of them
//! by two concurrent deliveries, as a broker redelivering would. The program prints
//! what was applied and exits with status 1 if any account was debited twice.
//!
//! Run it against any PostgreSQL you may create schemas in:
//!
//! ```sh
//! eval "$(scripts/services.sh)"   # or export OUTBOX_PG_URL=postgres://...
//! cargo run -p example-idempotent-consumer
//! ```

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox::consumer::{DecoupledConsumer, EntityStore, Handled};
use outbox::postgres::{sqlx, PgDedupConfig, PgDedupStore, PgEntityConfig, PgEntityStore};
use outbox::{
    ConsumerName, EntityKey, Error, ErrorKind, Message, MessageId, NewMessage, PublishOutcome,
    Publisher, Result,
};
use serde::{Deserialize, Serialize};

/// The consumer's state per account.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Account {
    balance: i64,
    debits: u32,
}

/// Stands in for a broker: counts what it was given, by id.
#[derive(Debug, Default)]
struct Broker {
    seen: Mutex<Vec<MessageId>>,
}

#[async_trait]
impl Publisher for Broker {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.extend(batch.iter().map(|m| m.id));
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

/// Deliver until the consumer stops asking for redelivery, as a broker would.
async fn deliver(
    consumer: &DecoupledConsumer<Account>,
    account: &EntityKey,
    id: MessageId,
    amount: i64,
) -> Result<Handled> {
    loop {
        let handled = consumer
            .handle(account, id, |mut state: Account| async move {
                state.balance -= amount;
                state.debits += 1;
                let debited = NewMessage::builder("payment.debited")
                    .partition_key(account.to_string())
                    .payload(amount.to_be_bytes().to_vec())
                    .build()?;
                Ok((state, vec![debited]))
            })
            .await;
        match handled {
            Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::Contention) => {
                tokio::task::yield_now().await;
            }
            other => return other,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {}", e.report());
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<bool> {
    let url = std::env::var("OUTBOX_PG_URL")
        .map_err(|_| Error::config("set OUTBOX_PG_URL (eval \"$(scripts/services.sh)\")"))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, "connect").with_source(e))?;
    let schema = format!("example_consumer_{}", std::process::id());
    let entities =
        PgEntityStore::new(pool.clone(), PgEntityConfig::default().with_schema(&schema))?;
    entities.install().await?;
    let dedup = PgDedupStore::new(
        pool.clone(),
        PgDedupConfig::default()
            .with_schema(&schema)
            .with_retention(Duration::from_secs(7 * 24 * 3600)),
    )?;
    dedup.install().await?;
    let broker = Arc::new(Broker::default());
    let entities: Arc<dyn EntityStore> = Arc::new(entities);
    let consumer = DecoupledConsumer::<Account>::new(
        ConsumerName::new("accounts")?,
        Arc::clone(&entities),
        Arc::new(dedup),
        broker.clone(),
    )?;

    let accounts: Vec<EntityKey> = (1..=5)
        .map(|n| EntityKey::new(format!("account-{n}")))
        .collect::<Result<_>>()?;
    let (mut applied, mut duplicates) = (0, 0);
    for round in 0..20u32 {
        let account = &accounts[round as usize % accounts.len()];
        let id = MessageId::new();
        // Every message twice: concurrently for even rounds, one after the other for odd.
        let outcomes = if round % 2 == 0 {
            let (a, b) = futures::join!(
                deliver(&consumer, account, id, 10),
                deliver(&consumer, account, id, 10)
            );
            vec![a?, b?]
        } else {
            vec![
                deliver(&consumer, account, id, 10).await?,
                deliver(&consumer, account, id, 10).await?,
            ]
        };
        for outcome in outcomes {
            match outcome {
                Handled::Applied { .. } => applied += 1,
                Handled::Duplicate | Handled::Redispatched { .. } => duplicates += 1,
            }
        }
    }

    let mut ok = true;
    for account in &accounts {
        let loaded = entities
            .load(account)
            .await?
            .expect("every account got messages");
        let state: Account = serde_json_value(loaded.record.state)?;
        let clean = loaded.record.outbox.is_empty();
        println!(
            "{account}: balance {:>4}, {} debits, outbox state left: {}",
            state.balance,
            state.debits,
            if clean { "none" } else { "some" }
        );
        ok &= state.debits == 4 && state.balance == -40 && clean;
    }
    let seen = broker
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let unique: HashSet<_> = seen.iter().collect();
    println!(
        "delivered 40 copies of 20 messages: {applied} applied, {duplicates} recognised as \
         copies; broker got {} messages ({} distinct)",
        seen.len(),
        unique.len()
    );
    sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&pool)
        .await
        .map_err(|e| Error::new(ErrorKind::Storage, "drop the example schema").with_source(e))?;
    if !ok || applied != 20 {
        eprintln!("a payment was applied twice (or not at all)");
    }
    Ok(ok && applied == 20)
}

fn serde_json_value(value: sqlx::types::JsonValue) -> Result<Account> {
    Account::deserialize(value)
        .map_err(|e| Error::new(ErrorKind::Decode, "account state").with_source(e))
}
