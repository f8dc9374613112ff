//! The inbox table: transactional recording, exactly one `New` under concurrency,
//! retention.

use std::time::Duration;

use outbox_core::{Dedup, DedupStore, ErrorKind, MessageId};
use outbox_postgres::{PgDedupConfig, PgDedupStore};

use crate::common;

async fn inbox(pool: &sqlx::PgPool, retention: Duration) -> PgDedupStore {
    let config = PgDedupConfig::default()
        .schema(common::schema_name())
        .retention(retention);
    let inbox = PgDedupStore::new(pool.clone(), config).unwrap();
    inbox.install().await.unwrap();
    inbox.install().await.unwrap();
    inbox
}

#[tokio::test]
async fn record_in_commits_and_rolls_back_with_the_transaction() {
    let Some(url) = common::url("inbox transactions") else {
        return;
    };
    let pool = common::pool(&url, 3).await;
    let inbox = inbox(&pool, Duration::from_secs(3600)).await;
    let id = MessageId::new();

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record_in(&mut tx, "billing", id).await.unwrap(),
        Dedup::New
    );
    assert_eq!(
        inbox.record_in(&mut tx, "billing", id).await.unwrap(),
        Dedup::Duplicate
    );
    tx.rollback().await.unwrap();
    assert!(
        !inbox.contains("billing", id).await.unwrap(),
        "rolled back with the handler"
    );

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        inbox.record_in(&mut tx, "billing", id).await.unwrap(),
        Dedup::New
    );
    tx.commit().await.unwrap();
    assert!(inbox.contains("billing", id).await.unwrap());
    assert_eq!(inbox.record("billing", id).await.unwrap(), Dedup::Duplicate);
    assert_eq!(
        inbox.record("shipping", id).await.unwrap(),
        Dedup::New,
        "scoped by consumer"
    );

    let err = inbox.record("", id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[tokio::test]
async fn concurrent_records_of_one_id_give_exactly_one_new() {
    let Some(url) = common::url("inbox concurrency") else {
        return;
    };
    let pool = common::pool(&url, 8).await;
    let inbox = inbox(&pool, Duration::from_secs(3600)).await;
    for _ in 0..5 {
        let id = MessageId::new();
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let inbox = inbox.clone();
                tokio::spawn(async move { inbox.record("billing", id).await.unwrap() })
            })
            .collect();
        let mut new = 0;
        for task in tasks {
            if task.await.unwrap() == Dedup::New {
                new += 1;
            }
        }
        assert_eq!(new, 1);
    }
}

#[tokio::test]
async fn expired_records_are_new_again_and_purged_in_bounded_batches() {
    let Some(url) = common::url("inbox retention") else {
        return;
    };
    let pool = common::pool(&url, 3).await;
    let inbox = inbox(&pool, Duration::from_secs(3600)).await;
    let ids: Vec<_> = (0..5).map(|_| MessageId::new()).collect();
    for id in &ids {
        assert_eq!(inbox.record("c", *id).await.unwrap(), Dedup::New);
    }
    let t = format!(
        "\"{}\".\"{}\"",
        inbox.config().schema_name(),
        inbox.config().table_name()
    );
    // Age all but the last past the retention period.
    sqlx::query(&format!(
        "UPDATE {t} SET processed_at = now() - interval '2 hours' WHERE message_id <> $1"
    ))
    .bind(ids[4].as_uuid())
    .execute(&pool)
    .await
    .unwrap();

    assert!(!inbox.contains("c", ids[0]).await.unwrap());
    assert_eq!(
        inbox.record("c", ids[0]).await.unwrap(),
        Dedup::New,
        "expired is new"
    );
    assert_eq!(inbox.purge_expired(2).await.unwrap(), 2, "bounded");
    assert_eq!(inbox.purge_expired(10).await.unwrap(), 1);
    assert_eq!(inbox.purge_expired(10).await.unwrap(), 0);
    assert!(inbox.contains("c", ids[0]).await.unwrap());
    assert!(inbox.contains("c", ids[4]).await.unwrap());
}
