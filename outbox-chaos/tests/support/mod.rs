//! Shared plumbing of the chaos tests: schemas, worker processes, waiting, and the
//! delivery check read from `<schema>.published`.

/// The private cluster the restart test runs on, shared with `pg_bench`'s soak.
pub(crate) use outbox_testkit::postgres::cluster;
pub(crate) mod dynamodb;
pub(crate) mod mariadb;
pub(crate) mod poison;
pub(crate) mod streams;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_chaos::{
    published_ddl, ENV_CRASH_ON, ENV_DYNAMODB_URL, ENV_FAULT_SEED, ENV_HELD_LOCK, ENV_MAX_ATTEMPTS,
    ENV_MYSQL_URL, ENV_PER_KEY, ENV_POOL_SIZE, ENV_SCHEMA, ENV_TABLE, ENV_URL, ENV_WORKER,
};
use outbox_core::{KeyOrder, NewMessage};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::OnceCell;
use uuid::Uuid;

pub(crate) use outbox_testkit::wait::DEADLINE;

/// The outbox table of the single-table tests.
pub(crate) const TABLE: &str = "outbox_messages";
/// How long test schemas are kept before a later run drops them.
const SCHEMA_TTL_SECS: u64 = 3600;
/// Log lines kept per worker.
const LOG_LINES: usize = 200;

/// The test database URL, or `None` after a visible skip line.
pub(crate) fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url("OUTBOX_PG_URL", what)
}

/// The tests run one at a time: each loads both cores of a CI machine with worker
/// processes and PostgreSQL, and the duplicate bounds assume publishes are not starved
/// past their timeout by a neighbouring test.
pub(crate) async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A small pool for the test's own queries on the shared test database; the first
/// call drops stale test schemas there.
pub(crate) async fn connect_shared(url: &str, max: u32) -> PgPool {
    let pool = connect(url, max).await;
    drop_stale_schemas(&pool).await;
    pool
}

/// A small pool for the test's own queries.
pub(crate) async fn connect(url: &str, max: u32) -> PgPool {
    let options: PgConnectOptions = url.parse().expect("a valid PostgreSQL URL");
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(20))
        .connect_with(options.application_name("outbox-chaos-test"))
        .await
        .expect("connect to PostgreSQL")
}

/// A fresh schema name, `obx_<unix seconds>_<random>`, so stale ones can be dropped.
pub(crate) fn schema_name() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let rand = Uuid::new_v4().simple().to_string();
    format!("obx_{secs}_{}", &rand[..12])
}

/// Drop test schemas older than an hour, once per test binary.
async fn drop_stale_schemas(pool: &PgPool) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let cutoff = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs()
            .saturating_sub(SCHEMA_TTL_SECS);
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::text FROM pg_namespace \
             WHERE nspname ~ '^obx_[0-9]+_[0-9a-f]+$' \
             AND split_part(nspname, '_', 2)::bigint < $1",
        )
        .bind(i64::try_from(cutoff).expect("seconds fit i64"))
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for schema in stale {
            // Names matched the pattern above, so they are plain identifiers.
            let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .execute(pool)
                .await;
        }
    })
    .await;
}

/// Drop a test's schema.
pub(crate) async fn drop_schema(pool: &PgPool, schema: &str) {
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(pool)
        .await
        .expect("drop the test schema");
}

/// Install an outbox table and `<schema>.published`.
pub(crate) async fn install(pool: &PgPool, schema: &str, table: &str, order: KeyOrder) -> PgOutbox {
    let config = PgOutboxConfig::default()
        .with_schema(schema)
        .with_table(table)
        .with_ordering(order);
    let outbox = PgOutbox::new(pool.clone(), config).expect("a valid outbox config");
    outbox.install().await.expect("install the outbox table");
    sqlx::raw_sql(&published_ddl(schema))
        .execute(pool)
        .await
        .expect("create the published table");
    outbox
}

/// `"schema"."table"`, for test SQL.
pub(crate) fn qualified(schema: &str, table: &str) -> String {
    format!("\"{schema}\".\"{table}\"")
}

/// A message the test enqueued, in enqueue order.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) id: Uuid,
    pub(crate) key: String,
}

/// `count` messages over `keys` partition keys (each key once, then picked by `rng`),
/// in enqueue order, with what the delivery check needs of each.
pub(crate) fn keyed_messages(
    count: usize,
    keys: usize,
    rng: &mut fastrand::Rng,
) -> (Vec<NewMessage>, Vec<Sent>) {
    (0..count)
        .map(|n| {
            let key = format!("key-{:03}", if n < keys { n } else { rng.usize(..keys) });
            let message = NewMessage::builder("chaos.events")
                .partition_key(key.as_str())
                .payload(format!("message {n}").into_bytes())
                .build()
                .expect("a valid message");
            let sent = Sent {
                id: message.id().as_uuid(),
                key,
            };
            (message, sent)
        })
        .unzip()
}

/// Enqueue `count` messages over `keys` partition keys (each key once, then at
/// random), in transactions of 100, one after another so that commit order is enqueue
/// order.
pub(crate) async fn enqueue_keyed(outbox: &PgOutbox, count: usize, keys: usize) -> Vec<Sent> {
    let (messages, sent) = keyed_messages(count, keys, &mut fastrand::Rng::new());
    for batch in messages.chunks(100) {
        let mut tx = outbox.pool().begin().await.expect("begin");
        outbox.enqueue(&mut tx, batch).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    sent
}

/// As [`enqueue_keyed`], as logical decoding messages of a log-tailing outbox.
pub(crate) async fn enqueue_keyed_wal(
    outbox: &outbox_postgres_wal::WalOutbox,
    count: usize,
    keys: usize,
) -> Vec<Sent> {
    let (messages, sent) = keyed_messages(count, keys, &mut fastrand::Rng::new());
    for batch in messages.chunks(100) {
        let mut tx = outbox.pool().begin().await.expect("begin");
        outbox.enqueue(&mut tx, batch).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    sent
}

/// Rows neither dispatched nor dead: pending or in flight.
pub(crate) async fn undelivered(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE dispatched_at IS NULL AND dead_at IS NULL"
    ))
    .fetch_one(pool)
    .await
    .expect("count undelivered rows")
}

/// Dead-lettered rows.
pub(crate) async fn dead(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE dead_at IS NOT NULL"
    ))
    .fetch_one(pool)
    .await
    .expect("count dead rows")
}

/// Distinct messages published so far.
pub(crate) async fn published_distinct(pool: &PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(DISTINCT message_id) FROM \"{schema}\".published"
    ))
    .fetch_one(pool)
    .await
    .expect("count published messages")
}

/// What `<schema>.published` says about the messages a test enqueued.
#[derive(Debug)]
pub(crate) struct Delivery {
    /// Enqueued messages never published.
    pub(crate) lost: usize,
    /// Publishes beyond the first of each message.
    pub(crate) duplicates: i64,
    /// Published ids the test did not enqueue.
    pub(crate) unexpected: usize,
    /// Keys whose first publishes are out of enqueue order, described.
    pub(crate) order_violations: Vec<String>,
}

impl Delivery {
    /// What every kill case asserts of it: nothing lost, nothing published that was not
    /// enqueued, at most `bound` duplicates, first publishes in key order.
    pub(crate) fn assert_within(&self, bound: i64) {
        assert_eq!(self.lost, 0, "messages lost: {self:?}");
        self.assert_published_within(bound);
    }

    /// [`assert_within`](Self::assert_within) without the loss check, for a case that
    /// checks loss itself: nothing published that was not enqueued, at most `bound`
    /// duplicates, first publishes in key order.
    pub(crate) fn assert_published_within(&self, bound: i64) {
        assert_eq!(self.unexpected, 0, "{self:?}");
        assert!(
            self.duplicates <= bound,
            "{} duplicates exceed the bound of {bound}",
            self.duplicates
        );
        assert!(
            self.order_violations.is_empty(),
            "per-key order broken: {:#?}",
            &self.order_violations[..self.order_violations.len().min(10)]
        );
    }
}

/// Compare `<schema>.published` with what was enqueued. Order is checked on each
/// message's first publish (lowest `seq`): per key, first publishes must follow enqueue
/// order. Republishes after a crash may come later, as at-least-once allows.
pub(crate) async fn check_delivery(pool: &PgPool, schema: &str, sent: &[Sent]) -> Delivery {
    let rows: Vec<(Uuid, i64, i64)> = sqlx::query_as(&format!(
        "SELECT message_id, min(seq), count(*) FROM \"{schema}\".published GROUP BY message_id"
    ))
    .fetch_all(pool)
    .await
    .expect("read the published table");
    let published: HashMap<Uuid, (i64, i64)> = rows
        .into_iter()
        .map(|(id, first, n)| (id, (first, n)))
        .collect();
    let lost = sent
        .iter()
        .filter(|s| !published.contains_key(&s.id))
        .count();
    let duplicates = published.values().map(|(_, n)| n - 1).sum();
    let sent_ids: std::collections::HashSet<Uuid> = sent.iter().map(|s| s.id).collect();
    let unexpected = published.keys().filter(|id| !sent_ids.contains(id)).count();
    // The last first-publish seen per key, with its enqueue position.
    let mut last: HashMap<&str, (i64, usize)> = HashMap::new();
    let mut order_violations = Vec::new();
    for (position, s) in sent.iter().enumerate() {
        let Some(&(first, _)) = published.get(&s.id) else {
            continue;
        };
        if let Some(&(previous, previous_position)) = last.get(s.key.as_str()) {
            if first < previous {
                order_violations.push(format!(
                    "{}: message #{position} first published at seq {first}, before \
                     message #{previous_position} (seq {previous})",
                    s.key
                ));
            }
        }
        last.insert(&s.key, (first, position));
    }
    Delivery {
        lost,
        duplicates,
        unexpected,
        order_violations,
    }
}

/// What a worker process connects to.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSpec {
    pub(crate) url: String,
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) order: KeyOrder,
    pub(crate) pool_size: u32,
    /// The MySQL / MariaDB server of the outbox, if not PostgreSQL.
    pub(crate) mysql_url: Option<String>,
    /// The DynamoDB endpoint of the outbox (table `table`), if not PostgreSQL.
    pub(crate) dynamodb_url: Option<String>,
    /// Held-lock claims instead of leases (PostgreSQL or MariaDB).
    pub(crate) held_lock: bool,
    /// A destination whose messages abort the worker, and the relay's attempts.
    pub(crate) crash: Option<Crash>,
}

/// Messages that crash the worker publishing them.
#[derive(Debug, Clone)]
pub(crate) struct Crash {
    /// Their destination.
    pub(crate) destination: String,
    /// The relay's `max_attempts`: how many crashes before the relay dead-letters them.
    pub(crate) max_attempts: u32,
}

/// A `chaos-worker` process. Dropping it kills the process.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) id: String,
    child: Child,
    stdin: Option<ChildStdin>,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Worker {
    /// Start a worker; its stdout and stderr are kept in memory (the last lines).
    pub(crate) fn spawn(spec: &WorkerSpec, id: impl Into<String>) -> Worker {
        Worker::spawn_bin(env!("CARGO_BIN_EXE_chaos-worker"), spec, id, None)
    }

    /// As [`spawn`](Self::spawn), the worker's fault injector (on DynamoDB) seeded
    /// with `seed`.
    pub(crate) fn spawn_seeded(spec: &WorkerSpec, id: impl Into<String>, seed: u64) -> Worker {
        Worker::spawn_bin(env!("CARGO_BIN_EXE_chaos-worker"), spec, id, Some(seed))
    }

    /// Start a log-tailing worker (`chaos-wal-worker`) on `spec.schema`'s slot.
    pub(crate) fn spawn_wal(spec: &WorkerSpec, id: impl Into<String>) -> Worker {
        Worker::spawn_bin(env!("CARGO_BIN_EXE_chaos-wal-worker"), spec, id, None)
    }

    /// Start a DynamoDB Streams worker (`chaos-streams-worker`) on `spec.table` at
    /// `spec.dynamodb_url`.
    pub(crate) fn spawn_streams(spec: &WorkerSpec, id: impl Into<String>) -> Worker {
        Worker::spawn_bin(env!("CARGO_BIN_EXE_chaos-streams-worker"), spec, id, None)
    }

    fn spawn_bin(
        bin: &str,
        spec: &WorkerSpec,
        id: impl Into<String>,
        fault_seed: Option<u64>,
    ) -> Worker {
        let id = id.into();
        let per_key = if spec.order == KeyOrder::PerKey {
            "1"
        } else {
            "0"
        };
        let mut command = Command::new(bin);
        if let Some(url) = &spec.mysql_url {
            command.env(ENV_MYSQL_URL, url);
        }
        if let Some(url) = &spec.dynamodb_url {
            command.env(ENV_DYNAMODB_URL, url);
        }
        if let Some(crash) = &spec.crash {
            command
                .env(ENV_CRASH_ON, &crash.destination)
                .env(ENV_MAX_ATTEMPTS, crash.max_attempts.to_string());
        }
        if let Some(seed) = fault_seed {
            command.env(ENV_FAULT_SEED, seed.to_string());
        }
        let mut child = command
            .env(ENV_URL, &spec.url)
            .env(ENV_SCHEMA, &spec.schema)
            .env(ENV_TABLE, &spec.table)
            .env(ENV_WORKER, &id)
            .env(ENV_PER_KEY, per_key)
            .env(ENV_HELD_LOCK, if spec.held_lock { "1" } else { "0" })
            .env(ENV_POOL_SIZE, spec.pool_size.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start chaos-worker");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            keep_lines(out, log.clone());
        }
        if let Some(err) = child.stderr.take() {
            keep_lines(err, log.clone());
        }
        Worker {
            id,
            stdin: child.stdin.take(),
            child,
            log,
        }
    }

    /// SIGKILL the process and reap it.
    pub(crate) async fn kill(&mut self) {
        self.child.kill().await.expect("SIGKILL a worker");
    }

    /// Close stdin (the worker shuts down gracefully) and wait for the exit; SIGKILL
    /// after 10 s.
    pub(crate) async fn stop(mut self) -> ExitStatus {
        drop(self.stdin.take());
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(status) => status.expect("wait for a worker"),
            Err(_) => {
                self.kill().await;
                panic!(
                    "worker {} did not stop within 10 s of stdin closing:\n{}",
                    self.id,
                    self.log_tail(20)
                );
            }
        }
    }

    /// The exit status, if the process has ended.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll a worker")
    }

    /// The last `n` lines the worker printed.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let skip = log.len().saturating_sub(n);
        log.iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// How many warnings and errors the worker logged.
    pub(crate) fn warnings(&self) -> usize {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .count()
    }

    /// The worker's log lines that contain `needle`.
    pub(crate) fn log_lines_with(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// The panic message the worker printed, if any (the line after "panicked at").
    pub(crate) fn panic_message(&self) -> Option<String> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let at = log.iter().position(|l| l.contains("panicked at"))?;
        Some(format!(
            "{} {}",
            log[at].trim(),
            log.get(at + 1).map(|l| l.trim()).unwrap_or("")
        ))
    }
}

/// Keep the last [`LOG_LINES`] lines of `stream` in `log`.
fn keep_lines(stream: impl AsyncRead + Unpin + Send + 'static, log: Arc<Mutex<VecDeque<String>>>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            if log.len() == LOG_LINES {
                log.pop_front();
            }
            log.push_back(line);
        }
    });
}

/// Wait until `done` holds, failing the test when a worker exits meanwhile or after
/// [`DEADLINE`]. Polls back off from 5 ms to 50 ms.
pub(crate) async fn wait_with_workers<F, Fut>(what: &str, workers: &mut [Worker], mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if done().await {
            return;
        }
        for worker in workers.iter_mut() {
            if let Some(status) = worker.exited() {
                panic!(
                    "worker {} exited ({status}) while waiting for {what}:\n{}",
                    worker.id,
                    worker.log_tail(30)
                );
            }
        }
        if start.elapsed() > DEADLINE {
            let logs: Vec<String> = workers
                .iter()
                .map(|w| format!("--- {}:\n{}", w.id, w.log_tail(10)))
                .collect();
            panic!(
                "timed out after {DEADLINE:?} waiting for {what}\n{}",
                logs.join("\n")
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// The server's clock now.
pub(crate) async fn db_now(
    pool: &PgPool,
) -> sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .expect("read the server's clock")
}

/// Failover after each kill of `killed` (the victim's worker id, when it was killed):
/// the time from the kill to the first publish, by another worker, of a message the
/// victim had published before it died (so held, unsettled). Printed as the median and
/// the longest over the kills that left such a message, in ms.
pub(crate) async fn failover(
    pool: &PgPool,
    schema: &str,
    killed: &[(
        String,
        sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>,
    )],
) -> String {
    let mut ms = Vec::new();
    for (victim, at) in killed {
        let first: Option<f64> = sqlx::query_scalar(&format!(
            "SELECT (extract(epoch FROM min(p2.published_at) - $2) * 1000)::float8 \
             FROM \"{schema}\".published AS p1 JOIN \"{schema}\".published AS p2 \
                 ON p2.message_id = p1.message_id AND p2.published_at > $2 \
             WHERE p1.worker = $1 AND p1.published_at <= $2"
        ))
        .bind(victim)
        .bind(at)
        .fetch_one(pool)
        .await
        .expect("read failover times");
        ms.extend(first);
    }
    if ms.is_empty() {
        return "none republished".to_owned();
    }
    ms.sort_by(f64::total_cmp);
    format!(
        "median {:.0} ms, max {:.0} ms over {} kills",
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len()
    )
}
