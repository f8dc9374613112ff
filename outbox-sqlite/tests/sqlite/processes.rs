//! Several processes on one file: each opens its own pool, as separate processes
//! would, and their relays deliver every message once.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{store::ClaimRequest, ErrorKind, OutboxStore, Relay, RelayConfig};
use outbox_sqlite::{connect_options, SqliteOutbox, SqliteOutboxConfig};
use outbox_testkit::RecordingPublisher;
use sqlx::sqlite::SqlitePoolOptions;

use crate::{common, enqueue, msg, LONG};

async fn second_process(db: &common::TempDb) -> SqliteOutbox {
    let pool = outbox_sqlite::open(db.path()).await.unwrap();
    SqliteOutbox::new(pool, SqliteOutboxConfig::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_in_two_processes_deliver_each_message_once() {
    let db = common::TempDb::new().await;
    let first = crate::outbox(&db).await;
    let second = second_process(&db).await;
    let publisher = Arc::new(RecordingPublisher::new());
    let config = |name: &str| {
        RelayConfig::default()
            .with_name(name)
            .with_batch_size(7)
            .with_poll_interval(Duration::from_millis(1))
            .with_max_poll_interval(Duration::from_millis(5))
    };
    let relays = [
        Relay::new(Arc::new(first.clone()), publisher.clone(), config("one")).unwrap(),
        Relay::new(Arc::new(second.clone()), publisher.clone(), config("two")).unwrap(),
    ];
    let handles: Vec<_> = relays.iter().map(Relay::spawn).collect();
    // Producers in both processes, while the relays run.
    let batches: Vec<Vec<_>> = (0..20)
        .map(|b| (0..15).map(|n| msg(b * 100 + n)).collect())
        .collect();
    for (i, batch) in batches.iter().enumerate() {
        let outbox = if i % 2 == 0 { &first } else { &second };
        enqueue(outbox, batch).await;
    }
    publisher
        .wait_for_unique(300, outbox_testkit::wait::DEADLINE)
        .await
        .unwrap();
    let mut claimed = 0;
    for handle in handles {
        let report = handle.shutdown().await.unwrap();
        claimed += report.claimed;
    }
    assert_eq!(publisher.duplicates(), 0, "no message published twice");
    assert_eq!(claimed, 300, "no message claimed twice");
    assert_eq!(crate::rows(&first).await, 0);
}

#[tokio::test]
async fn a_claim_waits_for_the_write_lock_up_to_the_busy_timeout() {
    let db = common::TempDb::new().await;
    let outbox = crate::outbox(&db).await;
    enqueue(&outbox, &[msg(1)]).await;
    // Another process with a short busy timeout.
    let impatient = SqlitePoolOptions::new()
        .connect_with(connect_options(db.path()).busy_timeout(Duration::from_millis(50)))
        .await
        .unwrap();
    let other = SqliteOutbox::new(impatient, SqliteOutboxConfig::default()).unwrap();
    // A business transaction holds the write lock.
    let writer = db.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let err = other
        .claim(ClaimRequest::new(1, LONG).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contention, "{}", err.report());
    assert!(err.is_retryable());
    writer.rollback().await.unwrap();
    // Once the lock is free, the same claim goes through.
    let claimed = other
        .claim(ClaimRequest::new(1, LONG).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
}
