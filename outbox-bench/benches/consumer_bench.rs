//! Idempotent consumers on PostgreSQL: messages handled per second through the
//! decoupled algorithm ([`DecoupledConsumer`] over [`PgEntityStore`] and
//! [`PgDedupStore`]) against the same-database inbox ([`PgDedupStore::process`]), at
//! concurrency 1 and 8, with the statements and commits each costs per message.
//!
//! ```text
//! eval "$(scripts/services.sh)"
//! cargo bench -p outbox-bench --bench consumer_bench              # 4,000 messages per run
//! cargo bench -p outbox-bench --bench consumer_bench -- --quick   # 1,000 (or OUTBOX_BENCH_QUICK=1)
//! ```
//!
//! Both do the same business work per message: add one to a counter of one of 1,000
//! entities (a row of the entity table for the decoupled path; a row of an `accounts`
//! table in the consumer's transaction for the inbox). The decoupled path also sends one
//! outgoing message per incoming message, to a no-op publisher. The decoupled path's
//! statements are counted by wrappers around its stores (each runs in a transaction of
//! its own); the inbox runs BEGIN, the inbox insert, the handler's UPDATE and COMMIT,
//! one transaction. The bench asserts nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_bench::{ops_per_sec, NoopPublisher};
use outbox_core::consumer::{
    DecoupledConsumer, EntityRecord, EntityStore, Handled, Loaded, Persisted, Processed, Version,
};
use outbox_core::{
    Consistency, ConsumerName, Dedup, DedupStore, EntityKey, Error, ErrorKind, MessageId,
    NewMessage, Result,
};
use outbox_postgres::{PgDedupConfig, PgDedupStore, PgEntityConfig, PgEntityStore};
use sqlx::PgPool;

const ENTITIES: usize = 1000;

/// Counts the statements the stores run.
#[derive(Debug)]
struct Counted<T> {
    inner: T,
    statements: Arc<AtomicU64>,
}

impl<T> Counted<T> {
    fn tick(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<T: EntityStore> EntityStore for Counted<T> {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        self.tick();
        self.inner.load(key).await
    }
    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        self.tick();
        self.inner.persist(key, expected, record).await
    }
}

#[async_trait]
impl<T: DedupStore> DedupStore for Counted<T> {
    fn consistency(&self) -> Consistency {
        self.inner.consistency()
    }
    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        self.tick();
        self.inner.contains(consumer, id).await
    }
    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        self.tick();
        self.inner.record(consumer, id).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.inner.purge_expired(limit).await
    }
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Counter {
    n: u64,
}

struct Run {
    per_sec: f64,
    statements: f64,
}

async fn decoupled(pool: &PgPool, schema: &str, messages: usize, concurrency: usize) -> Run {
    let statements = Arc::new(AtomicU64::new(0));
    let entities = PgEntityStore::new(pool.clone(), PgEntityConfig::default().with_schema(schema))
        .expect("entity store");
    entities.install().await.expect("install");
    let dedup = PgDedupStore::new(
        pool.clone(),
        PgDedupConfig::default()
            .with_schema(schema)
            .with_table("decoupled_inbox"),
    )
    .expect("dedup store");
    dedup.install().await.expect("install");
    let consumer = DecoupledConsumer::<Counter>::new(
        ConsumerName::new("bench").unwrap(),
        Arc::new(Counted {
            inner: entities,
            statements: Arc::clone(&statements),
        }),
        Arc::new(Counted {
            inner: dedup,
            statements: Arc::clone(&statements),
        }),
        Arc::new(NoopPublisher),
    )
    .expect("consumer");
    let keys: Arc<Vec<EntityKey>> = Arc::new(
        (0..ENTITIES)
            .map(|i| EntityKey::new(format!("e{i}")).unwrap())
            .collect(),
    );
    // Message `i` goes to entity `i % ENTITIES`, so concurrent tasks rarely share one.
    let per_sec = ops_per_sec(messages, concurrency, move |i| {
        let (consumer, keys) = (consumer.clone(), Arc::clone(&keys));
        async move {
            let key = &keys[i % ENTITIES];
            loop {
                let handled = consumer
                    .handle(key, MessageId::new(), |mut c: Counter| async move {
                        c.n += 1;
                        let out = NewMessage::builder("bench.out").build()?;
                        Ok((c, vec![out]))
                    })
                    .await;
                match handled {
                    Ok(Handled::Applied { .. }) => break,
                    Err(e) if e.kind() == ErrorKind::Conflict => continue,
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    })
    .await;
    Run {
        per_sec,
        statements: statements.load(Ordering::Relaxed) as f64 / messages as f64,
    }
}

async fn inbox(pool: &PgPool, schema: &str, messages: usize, concurrency: usize) -> Run {
    let dedup = PgDedupStore::new(
        pool.clone(),
        PgDedupConfig::default()
            .with_schema(schema)
            .with_table("inbox"),
    )
    .expect("dedup store");
    dedup.install().await.expect("install");
    let accounts = format!("\"{schema}\".accounts");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {accounts} (id int PRIMARY KEY, n bigint NOT NULL); \
         INSERT INTO {accounts} SELECT i, 0 FROM generate_series(0, {}) AS i",
        ENTITIES - 1
    ))
    .execute(pool)
    .await
    .expect("accounts");
    let bump = Arc::new(format!("UPDATE {accounts} SET n = n + 1 WHERE id = $1"));
    let consumer = ConsumerName::new("bench").unwrap();
    // Message `i` goes to entity `i % ENTITIES`, so concurrent tasks rarely share one.
    let per_sec = ops_per_sec(messages, concurrency, move |i| {
        let (dedup, consumer, bump) = (dedup.clone(), consumer.clone(), Arc::clone(&bump));
        async move {
            let id = i32::try_from(i % ENTITIES).unwrap();
            let done = dedup
                .process(&consumer, MessageId::new(), move |tx| {
                    Box::pin(async move {
                        sqlx::query(&bump)
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| Error::new(ErrorKind::Storage, "bump").with_source(e))?;
                        Ok(())
                    })
                })
                .await
                .expect("process");
            assert_eq!(done, Processed::Applied(()));
        }
    })
    .await;
    // BEGIN, the inbox insert, the handler's update, COMMIT.
    Run {
        per_sec,
        statements: 4.0,
    }
}

#[tokio::main]
async fn main() {
    let quick = outbox_bench::quick();
    if !quick && !outbox_bench::started_by_cargo_bench() {
        println!("consumer_bench: not started by `cargo bench`; skipping");
        return;
    }
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".to_owned());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await
        .expect("connect");
    let messages = if quick { 1000 } else { 4000 };
    let version: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&pool)
        .await
        .expect("version");
    println!("== Idempotent consumers: decoupled algorithm vs same-database inbox ==");
    println!(
        "compared: {messages} messages per run over {ENTITIES} entities, each adding 1 to its \
         entity's counter; decoupled = DecoupledConsumer over PgEntityStore + PgDedupStore \
         with one outgoing message to a no-op publisher; inbox = PgDedupStore::process with \
         one UPDATE in the consumer's transaction"
    );
    println!(
        "machine:  nproc={} (client and server share them); {version}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "  concurrency  decoupled/s  inbox/s  decoupled/inbox  statements/msg (dec, inbox)  transactions/msg (dec, inbox)"
    );
    println!(
        "  -----------  -----------  -------  ---------------  ---------------------------  -----------------------------"
    );
    for concurrency in [1, 8] {
        let schema = format!("obx_bench_consumer_{}_{concurrency}", std::process::id());
        let d = decoupled(&pool, &schema, messages, concurrency).await;
        let i = inbox(&pool, &schema, messages, concurrency).await;
        println!(
            "  {concurrency:>11}  {:>11.0}  {:>7.0}  {:>15.2}  {:>12.1} {:>14.1}  {:>14.1} {:>14}",
            d.per_sec,
            i.per_sec,
            d.per_sec / i.per_sec,
            d.statements,
            i.statements,
            d.statements,
            1
        );
        sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(&pool)
            .await
            .expect("drop");
    }
}
