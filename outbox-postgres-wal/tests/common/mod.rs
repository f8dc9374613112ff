//! Shared helpers: a private cluster with `wal_level = logical`, an installed outbox in
//! a fresh schema, relays run as tasks.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{NewMessage, Publisher, Result};
use outbox_postgres::PgOutboxConfig;
use outbox_postgres_wal::{
    ReplicationTarget, WalOutbox, WalOutboxConfig, WalRelay, WalRelayConfig, WalRelayReport,
};
use outbox_testkit::isolation;
use outbox_testkit::postgres::cluster::Cluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use outbox_testkit::wait::DEADLINE;
pub use outbox_testkit::wait_until;

/// Server settings for the private cluster: logical decoding on.
pub const LOGICAL: [(&str, &str); 3] = [
    ("wal_level", "logical"),
    ("max_wal_senders", "20"),
    ("max_replication_slots", "20"),
];

/// `service_test!` for the tests that start a private cluster, on a runtime of two
/// workers: ignored, with this reason, when the build found no PostgreSQL server
/// binaries. Each test awaits its fixture first (a future of `Option`: `None` skips it),
/// for example [`Env::start`] or [`Env::with_outbox`].
#[allow(unused_macros)]
macro_rules! wal_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "no PostgreSQL server binaries when built: see the build warning";
            flavor = multi_thread(2);
            $($tests)*
        }
    };
}

/// A private cluster (dropped last) and a pool on it.
pub struct Env {
    pub pool: PgPool,
    pub cluster: Cluster,
}

impl Env {
    /// A cluster with [`LOGICAL`] plus `extra` settings, or `None` after a visible skip
    /// line when the machine has no PostgreSQL server binaries (a failure under
    /// `OUTBOX_REQUIRE_INTEGRATION=1`).
    pub async fn start(extra: &[(&str, &str)]) -> Option<Env> {
        let settings: Vec<(&str, &str)> = LOGICAL.iter().chain(extra).copied().collect();
        Self::start_with_only(&settings).await
    }

    /// A cluster with exactly `settings` (each setting once), or `None` as for
    /// [`start`](Self::start).
    pub async fn start_with_only(settings: &[(&str, &str)]) -> Option<Env> {
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let cluster = match tokio::task::spawn_blocking(move || {
            let settings: Vec<(&str, &str)> = settings
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            Cluster::start_with(&settings).map_err(|e| e.to_string())
        })
        .await
        .expect("cluster start task")
        {
            Ok(c) => c,
            Err(why) if outbox_testkit::integration_required() => {
                panic!("OUTBOX_REQUIRE_INTEGRATION is set but no private cluster: {why}")
            }
            Err(why) => {
                eprintln!("SKIPPED: no private PostgreSQL cluster: {why}");
                return None;
            }
        };
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&cluster.url())
            .await
            .expect("connect to the private cluster");
        Some(Env { pool, cluster })
    }

    /// A cluster as [`start`](Self::start) starts it, and a fresh [`outbox`](Self::outbox)
    /// on it.
    pub async fn with_outbox(extra: &[(&str, &str)]) -> Option<(Env, WalOutbox)> {
        let env = Self::start(extra).await?;
        let outbox = env.outbox().await;
        Some((env, outbox))
    }

    pub fn target(&self) -> ReplicationTarget {
        ReplicationTarget::from_url(&self.cluster.url()).unwrap()
    }

    /// A fresh outbox: its own slot, prefix and dead-letter schema, installed.
    pub async fn outbox(&self) -> WalOutbox {
        let name = isolation::unique_name();
        let config = WalOutboxConfig::default()
            .with_slot(&name)
            .with_publication(&name)
            .with_prefix(&name)
            .with_dead_letters(PgOutboxConfig::default().with_schema(&name));
        let outbox = WalOutbox::new(self.pool.clone(), config).unwrap();
        outbox.install().await.unwrap();
        outbox
    }
}

/// Relay settings for tests: quick status updates, retries and lag checks.
pub fn fast() -> WalRelayConfig {
    WalRelayConfig::default()
        .with_batch_size(50)
        .with_status_interval(Duration::from_millis(50))
        .with_retry(
            outbox_core::RetryPolicy::new(5)
                .with_initial_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_millis(100)),
        )
        .with_initial_reconnect_backoff(Duration::from_millis(20))
        .with_max_reconnect_backoff(Duration::from_millis(200))
        .with_lock_retry(Duration::from_millis(50))
        .with_lag_interval(Duration::from_millis(200))
}

/// A relay running as a task.
pub struct Running {
    pub stop: CancellationToken,
    pub task: JoinHandle<Result<WalRelayReport>>,
}

impl Running {
    /// Cancel and wait for the report.
    pub async fn shutdown(self) -> WalRelayReport {
        self.stop.cancel();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("relay stops in time")
            .expect("relay task")
            .expect("relay result")
    }
}

pub fn spawn(
    env: &Env,
    outbox: &WalOutbox,
    publisher: Arc<dyn Publisher>,
    config: WalRelayConfig,
) -> Running {
    let relay = WalRelay::new(outbox.clone(), env.target(), publisher, config).unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    Running { stop, task }
}

/// Run a relay of `outbox` on `target` with no publisher to speak of and expect it to
/// stop by itself, within the deadline, with a permanent error: returned.
pub async fn run_until_refused(
    outbox: &WalOutbox,
    target: ReplicationTarget,
) -> outbox_core::Error {
    let relay = WalRelay::new(
        outbox.clone(),
        target,
        Arc::new(outbox_testkit::RecordingPublisher::new()),
        fast(),
    )
    .unwrap();
    let err = tokio::time::timeout(DEADLINE, relay.run(CancellationToken::new()))
        .await
        .expect("the relay stops by itself")
        .unwrap_err();
    assert!(!err.is_retryable(), "{}", err.report());
    err
}

/// Write log past the cluster's `max_slot_wal_keep_size` and checkpoint until the
/// server invalidates `outbox`'s slot.
pub async fn invalidate_slot(env: &Env, outbox: &WalOutbox) {
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS filler (x text)")
        .execute(&env.pool)
        .await
        .unwrap();
    wait_until("the slot is invalidated", || async {
        sqlx::raw_sql(
            "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); \
             SELECT pg_switch_wal(); CHECKPOINT;",
        )
        .execute(&env.pool)
        .await
        .unwrap();
        outbox.slot_status().await.unwrap().unwrap().invalidated
    })
    .await;
}

/// Enqueue `messages` in one committed transaction.
pub async fn commit(outbox: &WalOutbox, messages: &[NewMessage]) {
    let mut tx = outbox.pool().begin().await.unwrap();
    outbox.enqueue(&mut tx, messages).await.unwrap();
    tx.commit().await.unwrap();
}

/// `n` messages to `destination`, keyed round-robin over `keys` keys.
pub fn messages(destination: &str, n: usize, keys: usize) -> Vec<NewMessage> {
    (0..n)
        .map(|i| {
            NewMessage::builder(destination)
                .partition_key(format!("k{}", i % keys.max(1)))
                .payload(format!("{i}").into_bytes())
                .build()
                .unwrap()
        })
        .collect()
}

/// What [`Scripted`] answers for a message on its `n`th hand-over (from 1).
pub type Script = dyn Fn(&outbox_core::Message, u32) -> outbox_core::PublishOutcome + Send + Sync;

/// A publisher answering per message by a script, recording every batch handed to it
/// and every accepted message (in order).
#[derive(Clone)]
pub struct Scripted {
    script: Arc<Script>,
    state: Arc<std::sync::Mutex<ScriptedLog>>,
}

/// [`Scripted`]'s record.
#[derive(Default, Clone)]
pub struct ScriptedLog {
    /// Hand-overs per message id.
    pub seen: std::collections::HashMap<outbox_core::MessageId, u32>,
    /// Every batch handed over, as handed.
    pub batches: Vec<Vec<outbox_core::Message>>,
    /// Accepted messages, in order, repeats included.
    pub accepted: Vec<outbox_core::Message>,
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scripted")
    }
}

impl Scripted {
    pub fn new(
        script: impl Fn(&outbox_core::Message, u32) -> outbox_core::PublishOutcome
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Scripted {
            script: Arc::new(script),
            state: Arc::default(),
        }
    }

    pub fn log(&self) -> ScriptedLog {
        self.state.lock().unwrap().clone()
    }

    /// Whether every id in `ids` was accepted at least once.
    pub fn accepted_all(&self, ids: &[outbox_core::MessageId]) -> bool {
        let log = self.state.lock().unwrap();
        ids.iter()
            .all(|id| log.accepted.iter().any(|m| m.id == *id))
    }
}

#[async_trait::async_trait]
impl Publisher for Scripted {
    async fn publish(
        &self,
        batch: &[outbox_core::Message],
    ) -> Result<Vec<outbox_core::PublishOutcome>> {
        let mut log = self.state.lock().unwrap();
        log.batches.push(batch.to_vec());
        let mut outcomes = Vec::with_capacity(batch.len());
        for m in batch {
            let n = {
                let seen = log.seen.entry(m.id).or_insert(0);
                *seen += 1;
                *seen
            };
            let outcome = (self.script)(m, n);
            if outcome == outbox_core::PublishOutcome::Published {
                log.accepted.push(m.clone());
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }
}

/// Content in the crate's message layout (version 1) with a given id, destination
/// and payload, no key, content type or headers: what a foreign writer could emit.
pub fn raw_content(id: outbox_core::MessageId, destination: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![1_u8];
    out.extend_from_slice(id.as_uuid().as_bytes());
    out.extend_from_slice(&u32::try_from(destination.len()).unwrap().to_be_bytes());
    out.extend_from_slice(destination.as_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&0_u32.to_be_bytes());
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Emit `content` under `outbox`'s prefix, transactional or not, in its own statement.
pub async fn emit(outbox: &WalOutbox, transactional: bool, content: &[u8]) {
    sqlx::query("SELECT pg_logical_emit_message($1, $2, $3)")
        .bind(transactional)
        .bind(outbox.config().prefix())
        .bind(content)
        .execute(outbox.pool())
        .await
        .unwrap();
}

/// Dead letters of `outbox`, oldest id first.
pub async fn dead_letters(outbox: &WalOutbox) -> Vec<outbox_core::DeadLetter> {
    use outbox_core::OutboxAdmin;
    outbox
        .dead_letters()
        .dead_letters(
            &outbox_core::DeadLetterPage::new(outbox_core::DeadLetterFilter::default(), 100)
                .unwrap(),
        )
        .await
        .unwrap()
}
