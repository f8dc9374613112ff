//! The quickstart: an order service on an SQLite file, with nothing to install.
//!
//! 1. The service writes each order and its `orders.created` message in **one**
//!    transaction (the outbox).
//! 2. A relay publishes the messages to a broker. Midway, the relay is **killed** while
//!    a publish is in flight: that batch reached the broker but was never marked done,
//!    so a second relay publishes it again once its lease runs out.
//! 3. The broker also redelivers every fifth message on purpose, as real brokers do
//!    after a lost acknowledgement.
//! 4. Two consumer workers apply each message to a ledger **once**: the message id is
//!    recorded in an inbox table in the same transaction as the ledger write, so a
//!    second copy finds its id and is acknowledged without touching the ledger.
//!
//! It prints what happened and exits with status 1 if any order was lost or applied
//! twice, so CI runs it as a check. Run it from the repository root:
//!
//! ```sh
//! cargo run -p example-quickstart            # a fresh database file, removed at the end
//! cargo run -p example-quickstart -- shop.db # or keep the file to look at it
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox::consumer::Processed;
use outbox::sqlite::sqlx::{self, SqlitePool};
use outbox::sqlite::{SqliteDedupConfig, SqliteDedupStore, SqliteOutbox, SqliteOutboxConfig};
use outbox::{
    ConsumerName, Error, ErrorKind, Message, NewMessage, OutboxAdmin, PublishOutcome, Publisher,
    Relay, RelayConfig, Result,
};
use tokio::sync::{mpsc, oneshot};

/// Orders the service writes.
const ORDERS: u64 = 400;
/// The broker redelivers every fifth delivery once more.
const REDELIVER_EVERY: u64 = 5;
/// The broker's publish call during which the first relay is killed.
const KILL_ON_CALL: u64 = 4;
/// Longest the run may take before it gives up.
const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("quickstart failed: {}", err.report());
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool> {
    let started = Instant::now();
    let (path, keep) = match std::env::args_os().nth(1) {
        Some(path) => (PathBuf::from(path), true),
        None => (
            std::env::temp_dir().join(format!("outbox-quickstart-{}.db", std::process::id())),
            false,
        ),
    };
    let pool = outbox::sqlite::open(&path).await?;
    let store = SqliteOutbox::new(pool.clone(), SqliteOutboxConfig::default())?;
    store.install().await?;
    let inbox = SqliteDedupStore::new(pool.clone(), SqliteDedupConfig::default())?;
    inbox.install().await?;
    for ddl in [
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS ledger (order_id INTEGER NOT NULL, amount INTEGER NOT NULL)",
    ] {
        sqlx::query(ddl)
            .execute(&pool)
            .await
            .map_err(db("create tables"))?;
    }
    if keep {
        println!("database file {}", path.display());
    }

    let (deliveries, received) = mpsc::unbounded_channel();
    let (kill_signal, kill) = oneshot::channel();
    let broker = Arc::new(Broker::new(deliveries, kill_signal));
    let received = Arc::new(tokio::sync::Mutex::new(received));
    let duplicates = Arc::new(AtomicU64::new(0));
    let consumers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(consume(inbox.clone(), received.clone(), duplicates.clone())))
        .collect();

    // A short lease, so the crash is recovered from within a second.
    let config = RelayConfig::default()
        .with_batch_size(25)
        .with_lease(Duration::from_secs(1))
        .with_publish_batch_size(25)
        .with_publish_concurrency(1)
        .with_publish_timeout(Duration::from_millis(500))
        .with_poll_interval(Duration::from_millis(5))
        .with_max_poll_interval(Duration::from_millis(50));
    let first = Relay::new(
        Arc::new(store.clone()),
        broker.clone(),
        config.clone().with_name("first"),
    )?
    .spawn();

    // The service: each order and its message in one transaction, then a wake-up.
    let writer = {
        let (pool, store, wake) = (pool.clone(), store.clone(), first.relay().wakeup());
        tokio::spawn(async move {
            for id in 1..=ORDERS {
                place_order(&pool, &store, id).await?;
                wake.wake();
            }
            Ok::<_, Error>(())
        })
    };

    // Kill the first relay in the middle of a publish, then start a second one.
    let _ = kill.await;
    first.abort().await;
    println!("relay `first` killed while its batch was at the broker");
    let second = Relay::new(
        Arc::new(store.clone()),
        broker.clone(),
        config.with_name("second"),
    )?;
    let second = second.spawn();
    writer.await.map_err(panicked)??;

    // Done when nothing is left in the outbox: every message published and completed.
    let give_up = Instant::now() + DEADLINE;
    loop {
        let stats = store.stats().await?;
        if stats.pending + stats.in_flight == 0 {
            break;
        }
        if Instant::now() > give_up {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("outbox not drained: {stats:?}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = second.shutdown().await?;
    broker.close();
    for consumer in consumers {
        consumer.await.map_err(panicked)??;
    }

    let (applied, applied_twice) = ledger(&pool).await?;
    let delivered = broker.delivered.load(Ordering::Relaxed);
    let redelivered = broker.redelivered.load(Ordering::Relaxed);
    println!();
    println!("orders written                      {ORDERS}");
    println!("messages published by relay second  {}", report.dispatched);
    println!("deliveries at the consumers         {delivered}");
    println!("  copies the broker redelivered     {redelivered}");
    println!(
        "  copies published again after the crash {}",
        delivered - redelivered - ORDERS.min(delivered - redelivered)
    );
    println!(
        "duplicates suppressed by the inbox  {}",
        duplicates.load(Ordering::Relaxed)
    );
    println!("orders applied to the ledger        {applied}");
    println!(
        "time taken                          {:.2?}",
        started.elapsed()
    );
    pool.close().await;
    if !keep {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
    if applied != ORDERS || applied_twice > 0 {
        eprintln!(
            "FAILED: {} orders never applied, {applied_twice} applied more than once",
            ORDERS.saturating_sub(applied)
        );
        return Ok(false);
    }
    println!("every order applied exactly once");
    Ok(true)
}

/// Write order `id` and its message in one transaction.
async fn place_order(pool: &SqlitePool, store: &SqliteOutbox, id: u64) -> Result<()> {
    let amount = i64::try_from(id * 10).map_err(|_| Error::invalid_input("order id too large"))?;
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(db("begin"))?;
    sqlx::query("INSERT INTO orders (id, amount) VALUES (?1, ?2)")
        .bind(amount / 10)
        .bind(amount)
        .execute(&mut *tx)
        .await
        .map_err(db("insert order"))?;
    let message = NewMessage::builder("orders.created")
        .partition_key(format!("order-{id}"))
        .payload(id.to_string())
        .content_type("text/plain")
        .build()?;
    store.enqueue(&mut tx, &[message]).await?;
    tx.commit().await.map_err(db("commit"))
}

/// A consumer worker: apply each delivery once, through the inbox.
async fn consume(
    inbox: SqliteDedupStore,
    received: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>>,
    duplicates: Arc<AtomicU64>,
) -> Result<()> {
    let ledger = ConsumerName::new("ledger")?;
    loop {
        let Some(message) = received.lock().await.recv().await else {
            return Ok(());
        };
        let order: i64 = std::str::from_utf8(&message.payload)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| Error::invalid_input("payload is not an order id"))?;
        let outcome = inbox
            .process(&ledger, message.id, move |tx| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?1, ?1 * 10)")
                        .bind(order)
                        .execute(&mut *tx)
                        .await
                        .map_err(db("apply to the ledger"))?;
                    Ok(())
                })
            })
            .await?;
        if outcome == Processed::Duplicate {
            duplicates.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Orders in the ledger, and how many of them more than once.
async fn ledger(pool: &SqlitePool) -> Result<(u64, u64)> {
    let (applied, twice): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE n > 1) \
         FROM (SELECT order_id, count(*) AS n FROM ledger GROUP BY order_id)",
    )
    .fetch_one(pool)
    .await
    .map_err(db("read the ledger"))?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok((count(applied), count(twice)))
}

/// An in-process broker: it hands messages to the consumers, redelivers some, and on
/// one publish call delivers the batch but never acknowledges it, so the relay can be
/// killed mid-publish.
#[derive(Debug)]
struct Broker {
    deliveries: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    kill_signal: Mutex<Option<oneshot::Sender<()>>>,
    calls: AtomicU64,
    delivered: AtomicU64,
    redelivered: AtomicU64,
}

impl Broker {
    fn new(deliveries: mpsc::UnboundedSender<Message>, kill_signal: oneshot::Sender<()>) -> Self {
        Broker {
            deliveries: Mutex::new(Some(deliveries)),
            kill_signal: Mutex::new(Some(kill_signal)),
            calls: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            redelivered: AtomicU64::new(0),
        }
    }

    /// Stop delivering: the consumers finish what they hold and end.
    fn close(&self) {
        self.deliveries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    fn deliver(&self, message: &Message) {
        if let Some(deliveries) = &*self.deliveries.lock().unwrap_or_else(|p| p.into_inner()) {
            let n = self.delivered.fetch_add(1, Ordering::Relaxed) + 1;
            let _ = deliveries.send(message.clone());
            if n.is_multiple_of(REDELIVER_EVERY) {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                self.redelivered.fetch_add(1, Ordering::Relaxed);
                let _ = deliveries.send(message.clone());
            }
        }
    }
}

#[async_trait]
impl Publisher for Broker {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        for message in batch {
            self.deliver(message);
        }
        if self.calls.fetch_add(1, Ordering::Relaxed) + 1 == KILL_ON_CALL {
            let signal = self
                .kill_signal
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(signal) = signal {
                let _ = signal.send(());
                // Never acknowledge: the relay is killed while waiting here.
                std::future::pending::<()>().await;
            }
        }
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

fn db(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| Error::new(ErrorKind::Storage, format!("{what} failed")).with_source(e)
}

fn panicked(e: tokio::task::JoinError) -> Error {
    Error::new(ErrorKind::Panicked, e.to_string())
}
