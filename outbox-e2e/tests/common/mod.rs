//! The story both end-to-end tests tell, the broker aside: a PostgreSQL schema with the
//! outbox, the inbox, the producer's `orders` and the consumer's `ledger`; the
//! producer; relays that crash on cue and are restarted (`relays.rs`); what the
//! consumer does with a delivery; and the checks at the end. `tests/otel.rs` uses only
//! the schema.

// Each test binary compiles this module and uses a part of it.
#![allow(unreachable_pub, dead_code, unused_imports)]

mod relays;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::consumer::Processed;
use outbox_core::{
    ConsumerName, Error, ErrorKind, MessageId, NewMessage, OutboxAdmin, OutboxStats, Result,
};
use outbox_postgres::{PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig};
use outbox_testkit::wait::{wait_until, within};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::{watch, OnceCell};
use tokio::task::JoinHandle;

pub use relays::{Connect, RelayTotals, Relays, Wakeups, CRASHES};

/// Messages the producer enqueues.
pub const MESSAGES: u64 = 2_000;
/// Messages per producer transaction.
const PER_TRANSACTION: u64 = 10;
/// The producer stays at most this many messages ahead of what the broker confirmed,
/// so it is still writing when the relays crash.
const AHEAD: u64 = 300;
/// The publishers' ack / confirm timeout.
pub const BROKER_TIMEOUT: Duration = Duration::from_millis(1_200);
/// The consumer asks for a redelivery of every message whose sequence number is a
/// multiple of this, on its first delivery, after applying it (a lost ack).
const REDELIVER_EVERY: u64 = 25;
/// Redeliveries the consumer asks for: one per selected sequence number.
pub const REDELIVERIES: u64 = MESSAGES / REDELIVER_EVERY;
/// The inbox's name for the consumer.
const CONSUMER: &str = "ledger";
/// How long test schemas are kept before a later run drops them.
const SCHEMA_TTL_SECS: u64 = 3600;

/// `var`'s URL, or `None` after a visible skip line (a failure under
/// `OUTBOX_REQUIRE_INTEGRATION=1`).
pub fn service_url(var: &str, what: &str) -> Option<String> {
    outbox_testkit::service_url(var, what)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A fresh name, `obx_<unix seconds>_<random>`, for the schema and the broker's stream
/// or queue of one test, so stale ones can be told by age.
fn unique_name() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("obx_{}_{}", now_secs(), &random[..12])
}

/// The name of a test resource created before `SCHEMA_TTL_SECS` ago.
pub fn is_stale(name: &str) -> bool {
    let cutoff = now_secs().saturating_sub(SCHEMA_TTL_SECS);
    name.strip_prefix("obx_")
        .and_then(|rest| rest.split('_').next())
        .and_then(|secs| secs.parse::<u64>().ok())
        .is_some_and(|secs| secs < cutoff)
}

fn storage(what: &str) -> impl Fn(sqlx::Error) -> Error + '_ {
    move |e| Error::new(ErrorKind::Storage, format!("{what} failed")).with_source(e)
}

/// Expect `result` to be `Ok`, printing the whole cause chain otherwise.
pub fn ok<T>(what: &str, result: Result<T>) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {}", e.report()))
}

/// One test's database side: a schema holding the outbox, the inbox, `orders` (the
/// producer's business rows) and `ledger` (the consumer's effect, one row per apply,
/// deliberately without a unique constraint).
#[derive(Debug, Clone)]
pub struct Story {
    /// The schema's name, used for the broker's stream or queue too.
    pub name: String,
    pool: PgPool,
    /// The outbox the relays claim from.
    pub outbox: PgOutbox,
    inbox: PgDedupStore,
    consumer: ConsumerName,
    insert_ledger: Arc<str>,
}

impl Story {
    /// Connect to `url` and install everything in a fresh schema.
    pub async fn new(url: &str) -> Story {
        let options: PgConnectOptions = url.parse().expect("a valid OUTBOX_PG_URL");
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(20))
            .connect_with(options.application_name("outbox-e2e"))
            .await
            .expect("connect to OUTBOX_PG_URL");
        drop_stale_schemas(&pool).await;
        let name = unique_name();
        let outbox = ok(
            "outbox config",
            PgOutbox::new(
                pool.clone(),
                PgOutboxConfig::default().with_schema(name.clone()),
            ),
        );
        ok("install the outbox", outbox.install().await);
        let inbox = ok(
            "inbox config",
            PgDedupStore::new(
                pool.clone(),
                PgDedupConfig::default().with_schema(name.clone()),
            ),
        );
        ok("install the inbox", inbox.install().await);
        let ddl = format!(
            "CREATE TABLE \"{name}\".orders (seq bigint PRIMARY KEY, message_id uuid NOT NULL); \
             CREATE TABLE \"{name}\".ledger (message_id uuid NOT NULL, seq bigint NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        );
        sqlx::raw_sql(&ddl)
            .execute(&pool)
            .await
            .expect("create orders and ledger");
        Story {
            insert_ledger: format!(
                "INSERT INTO \"{name}\".ledger (message_id, seq) VALUES ($1, $2)"
            )
            .into(),
            consumer: ok("consumer name", ConsumerName::new(CONSUMER)),
            name,
            pool,
            outbox,
            inbox,
        }
    }

    /// The producer: [`MESSAGES`] orders to `destination`, [`PER_TRANSACTION`] per
    /// transaction (rows and messages commit together), waking the relays after each
    /// commit and staying at most [`AHEAD`] messages ahead of `published`.
    pub fn produce(
        &self,
        destination: &str,
        mut published: watch::Receiver<u64>,
        wakeups: Wakeups,
    ) -> JoinHandle<u64> {
        let (story, destination) = (self.clone(), destination.to_owned());
        let insert_orders = format!(
            "INSERT INTO \"{}\".orders (seq, message_id) \
             SELECT * FROM UNNEST($1::bigint[], $2::uuid[])",
            self.name
        );
        tokio::spawn(async move {
            let mut enqueued = 0;
            while enqueued < MESSAGES {
                within(
                    "the broker to confirm what the producer wrote",
                    published.wait_for(|p| p + AHEAD >= enqueued),
                )
                .await
                .expect("the crash plan outlives the producer");
                let (mut seqs, mut ids, mut messages) = (Vec::new(), Vec::new(), Vec::new());
                for seq in enqueued + 1..=(enqueued + PER_TRANSACTION).min(MESSAGES) {
                    let message = ok(
                        "build a message",
                        NewMessage::builder(destination.as_str())
                            .payload(seq.to_string())
                            .content_type("text/plain")
                            .build(),
                    );
                    seqs.push(i64::try_from(seq).expect("small sequence numbers"));
                    ids.push(message.id().as_uuid());
                    messages.push(message);
                }
                let mut tx = story.pool.begin().await.expect("begin");
                sqlx::query(&insert_orders)
                    .bind(&seqs)
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .expect("insert orders");
                ok("enqueue", story.outbox.enqueue(&mut tx, &messages).await);
                tx.commit().await.expect("commit");
                enqueued += messages.len() as u64;
                wakeups.wake();
            }
            enqueued
        })
    }

    /// Apply message `id` (order `seq`) through the inbox: record the id and insert a
    /// ledger row in one transaction.
    async fn apply(&self, id: MessageId, seq: i64) -> Result<Processed<()>> {
        let sql = self.insert_ledger.clone();
        self.inbox
            .process(&self.consumer, id, move |tx| {
                Box::pin(async move {
                    sqlx::query(&sql)
                        .bind(id.as_uuid())
                        .bind(seq)
                        .execute(&mut *tx)
                        .await
                        .map_err(storage("insert a ledger row"))?;
                    Ok(())
                })
            })
            .await
    }

    /// Wait until the consumer applied every message and the outbox holds nothing due
    /// or in flight (the crashed relays' batches were published again and completed).
    pub async fn wait_drained(&self, tally: &Tally) {
        wait_until("every message applied and the outbox drained", || async {
            if tally.applied() < MESSAGES {
                return false;
            }
            let stats = ok("outbox stats", self.outbox.stats().await);
            stats.pending + stats.in_flight == 0
        })
        .await;
    }

    /// What the ledger, the orders and the outbox hold now.
    pub async fn verify(&self) -> Ledger {
        let name = &self.name;
        let count = |sql: String| {
            let pool = self.pool.clone();
            async move {
                let n: i64 = sqlx::query_scalar(&sql)
                    .fetch_one(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                u64::try_from(n).expect("a count")
            }
        };
        Ledger {
            orders: count(format!("SELECT count(*) FROM \"{name}\".orders")).await,
            rows: count(format!("SELECT count(*) FROM \"{name}\".ledger")).await,
            ids_applied_twice: count(format!(
                "SELECT count(*) FROM (SELECT message_id FROM \"{name}\".ledger \
                 GROUP BY message_id HAVING count(*) > 1) twice"
            ))
            .await,
            orders_not_applied_once: count(format!(
                "SELECT count(*) FROM \"{name}\".orders o WHERE (SELECT count(*) \
                 FROM \"{name}\".ledger l WHERE l.message_id = o.message_id \
                 AND l.seq = o.seq) <> 1"
            ))
            .await,
            inbox_ids: count(format!("SELECT count(*) FROM \"{name}\".outbox_inbox")).await,
            outbox: ok("outbox stats", self.outbox.stats().await),
        }
    }

    /// Drop the schema (a passing test's; a failing one leaves it for a look, and a
    /// later run drops it after an hour).
    pub async fn teardown(self) {
        sqlx::raw_sql(&format!("DROP SCHEMA \"{}\" CASCADE", self.name))
            .execute(&self.pool)
            .await
            .expect("drop the test schema");
        self.pool.close().await;
    }
}

/// Drop test schemas older than an hour (left by failed runs), once per test binary.
async fn drop_stale_schemas(pool: &PgPool) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::text FROM pg_namespace WHERE nspname ~ '^obx_[0-9]+_[0-9a-f]+$'",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for name in names.iter().filter(|name| is_stale(name)) {
            // The pattern above admits plain identifiers only.
            let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                .execute(pool)
                .await;
        }
    })
    .await;
}

/// What the database holds at the end.
#[derive(Debug)]
pub struct Ledger {
    pub orders: u64,
    pub rows: u64,
    pub ids_applied_twice: u64,
    pub orders_not_applied_once: u64,
    pub inbox_ids: u64,
    pub outbox: OutboxStats,
}

impl Ledger {
    /// Every order applied exactly once, and nothing left in the outbox.
    pub fn assert_exactly_once(&self) {
        assert_eq!(self.orders, MESSAGES, "orders written");
        assert_eq!(
            self.ids_applied_twice, 0,
            "message ids applied more than once"
        );
        assert_eq!(
            self.orders_not_applied_once, 0,
            "orders not applied exactly once with their own message id"
        );
        assert_eq!(self.rows, MESSAGES, "ledger rows");
        assert_eq!(self.inbox_ids, MESSAGES, "ids recorded in the inbox");
        let o = &self.outbox;
        assert_eq!(
            (o.pending, o.in_flight, o.dead, o.dispatched),
            (0, 0, 0, 0),
            "the outbox is empty: {o:?}"
        );
    }
}

/// What every broker's run must end with: each order applied exactly once and the
/// outbox empty, every message produced, every planned crash made, and no dead letter
/// or panic on the way.
pub fn assert_story(ledger: &Ledger, produced: u64, relays: &RelayTotals) {
    ledger.assert_exactly_once();
    assert_eq!(produced, MESSAGES);
    assert_eq!(relays.crashes, CRASHES, "every planned crash happened");
    assert_eq!(relays.dead_lettered, 0);
    assert_eq!(relays.panics, 0);
}

/// The consumer's counts, shared by its workers.
#[derive(Debug, Default)]
pub struct Tally {
    deliveries: AtomicU64,
    applied: AtomicU64,
    duplicates: AtomicU64,
    acks: AtomicU64,
    redeliveries_asked: AtomicU64,
}

/// What to tell the broker about a delivery the consumer has applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Acknowledge it.
    Ack,
    /// Ask for it again (nack / requeue), as if the ack had been lost.
    Redeliver,
}

impl Tally {
    pub fn deliveries(&self) -> u64 {
        self.deliveries.load(Ordering::SeqCst)
    }
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }
    /// Deliveries the inbox found already applied.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::SeqCst)
    }
    pub fn acks(&self) -> u64 {
        self.acks.load(Ordering::SeqCst)
    }
    pub fn redeliveries_asked(&self) -> u64 {
        self.redeliveries_asked.load(Ordering::SeqCst)
    }
    /// Deliveries neither acknowledged nor sent back yet.
    pub fn in_hand(&self) -> u64 {
        // Settled first: a delivery is counted before it is settled, so the later read
        // of `deliveries` is never below it.
        let settled = self.acks() + self.redeliveries_asked();
        self.deliveries() - settled
    }

    /// Count an acknowledgement the broker took.
    pub fn acked(&self) {
        self.acks.fetch_add(1, Ordering::SeqCst);
    }
    /// Count a redelivery request the broker took.
    pub fn sent_back(&self) {
        self.redeliveries_asked.fetch_add(1, Ordering::SeqCst);
    }
}

/// Handle one delivery: parse it, apply it through the inbox (committed before the
/// broker hears anything), and say how to settle it. `first_delivery` is the broker's
/// word that no earlier delivery of this copy was made; some of those are sent back.
///
/// # Panics
/// When the delivery is not one of the producer's messages, or the inbox fails.
pub async fn consume(
    story: &Story,
    tally: &Tally,
    message_id: Option<&str>,
    payload: &[u8],
    first_delivery: bool,
) -> Settle {
    tally.deliveries.fetch_add(1, Ordering::SeqCst);
    let id: MessageId = message_id
        .expect("the delivery carries the message id")
        .parse()
        .expect("the message id is the outbox id");
    let seq: u64 = std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.parse().ok())
        .expect("the payload is an order's sequence number");
    let applied = ok(
        "apply through the inbox",
        story
            .apply(id, i64::try_from(seq).expect("small sequence numbers"))
            .await,
    );
    match applied {
        Processed::Applied(()) => tally.applied.fetch_add(1, Ordering::SeqCst),
        Processed::Duplicate => tally.duplicates.fetch_add(1, Ordering::SeqCst),
    };
    if first_delivery && seq.is_multiple_of(REDELIVER_EVERY) {
        Settle::Redeliver
    } else {
        Settle::Ack
    }
}
