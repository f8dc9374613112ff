//! The inbox table's transactional recording: `record_in` commits and rolls back with
//! the handler's transaction, and a concurrent transaction recording the same id waits
//! for it. Atomicity, consumer scoping, expiry and purging are in the shared suite
//! (`tests/dedup_lock_conformance.rs`).

use std::time::Duration;

use outbox_core::{ConsumerName, Dedup, DedupStore, MessageId};
use outbox_postgres::{PgDedupConfig, PgDedupStore};

use crate::common;

async fn inbox(pool: &sqlx::PgPool) -> PgDedupStore {
    let config = PgDedupConfig::default()
        .with_schema(common::schema_name())
        .with_retention(Duration::from_secs(3600));
    let inbox = PgDedupStore::new(pool.clone(), config).unwrap();
    inbox.install().await.unwrap();
    inbox.install().await.unwrap();
    inbox
}

fn billing() -> ConsumerName {
    ConsumerName::new("billing").unwrap()
}

#[tokio::test]
async fn record_in_commits_and_rolls_back_with_the_transaction() {
    let Some(url) = common::url("inbox transactions") else {
        return;
    };
    let pool = common::pool(&url, 3).await;
    let inbox = inbox(&pool).await;
    let (billing, id) = (billing(), MessageId::new());

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record_in(&mut tx, &billing, id).await.unwrap(),
        Dedup::New
    );
    assert_eq!(
        inbox.record_in(&mut tx, &billing, id).await.unwrap(),
        Dedup::Duplicate
    );
    tx.rollback().await.unwrap();
    assert!(
        !inbox.contains(&billing, id).await.unwrap(),
        "rolled back with the handler"
    );

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record_in(&mut tx, &billing, id).await.unwrap(),
        Dedup::New
    );
    tx.commit().await.unwrap();
    assert!(inbox.contains(&billing, id).await.unwrap());
    assert_eq!(inbox.record(&billing, id).await.unwrap(), Dedup::Duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_in_waits_for_an_open_transaction_recording_the_same_id() {
    let Some(url) = common::url("inbox concurrent transactions") else {
        return;
    };
    let pool = common::pool(&url, 3).await;
    let inbox = inbox(&pool).await;
    for first_commits in [false, true] {
        let id = MessageId::new();
        let mut first = pool.begin().await.unwrap();
        assert_eq!(
            inbox.record_in(&mut first, &billing(), id).await.unwrap(),
            Dedup::New
        );
        // The first transaction's row exists, uncommitted: this insert conflicts with
        // it and waits for the first transaction to end.
        let second = tokio::spawn({
            let (pool, inbox) = (pool.clone(), inbox.clone());
            async move {
                let mut tx = pool.begin().await.unwrap();
                let seen = inbox.record_in(&mut tx, &billing(), id).await.unwrap();
                tx.commit().await.unwrap();
                seen
            }
        });
        if first_commits {
            first.commit().await.unwrap();
        } else {
            first.rollback().await.unwrap();
        }
        let expected = if first_commits {
            Dedup::Duplicate
        } else {
            Dedup::New
        };
        assert_eq!(
            tokio::time::timeout(common::DEADLINE, second)
                .await
                .expect("the second transaction finishes")
                .unwrap(),
            expected,
            "first transaction committed: {first_commits}"
        );
        assert!(inbox.contains(&billing(), id).await.unwrap());
    }
}
