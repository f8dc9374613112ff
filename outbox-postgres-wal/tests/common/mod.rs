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
use outbox_testkit::pg_cluster::Cluster;
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
        let settings: Vec<(String, String)> = LOGICAL
            .iter()
            .chain(extra)
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
            outbox_core::RetryPolicy::with_max_attempts(5)
                .backoff(Duration::from_millis(20), Duration::from_millis(100)),
        )
        .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
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
