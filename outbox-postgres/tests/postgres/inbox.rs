//! The inbox table's transactional recording: `record_in` commits and rolls back with
//! the handler's transaction, and a concurrent transaction recording the same id waits
//! for it. Atomicity, consumer scoping, expiry and purging are in the shared suite
//! (`tests/conformance.rs`).

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

pg_test! {
    async fn record_in_commits_and_rolls_back_with_the_transaction(
        pool = common::connect("inbox transactions", 3)
    ) {
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
}

pg_test! {
    flavor = multi_thread(2);

    async fn record_in_waits_for_an_open_transaction_recording_the_same_id(
        pool = common::connect("inbox concurrent transactions", 3)
    ) {
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
}

pg_test! {
    /// `process` applies a message once however many copies arrive concurrently: each copy
    /// increments a counter row in the handler's transaction, and the counter ends at 1. A
    /// handler error rolls back the id with the writes, so the next copy applies.
    async fn process_applies_each_id_once_and_rolls_back_with_the_handler(
        pool = common::connect("inbox process", 8)
    ) {
        use outbox_core::consumer::Processed;
        use outbox_core::{Error, ErrorKind};

        let inbox = inbox(&pool).await;
        let counter = format!("{}.applied", inbox.config().schema());
        sqlx::raw_sql(&format!(
            "CREATE TABLE {counter} (id int PRIMARY KEY, n int NOT NULL); \
             INSERT INTO {counter} VALUES (1, 0)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let bump = format!("UPDATE {counter} SET n = n + 1 WHERE id = 1");
        let (billing, id) = (billing(), MessageId::new());

        let failed = inbox
            .process(&billing, id, |tx| {
                let bump = bump.clone();
                Box::pin(async move {
                    sqlx::query(&bump).execute(&mut *tx).await.unwrap();
                    Err::<(), _>(Error::new(ErrorKind::Publish, "handler failed"))
                })
            })
            .await;
        assert_eq!(failed.unwrap_err().kind(), ErrorKind::Publish);
        assert!(!inbox.contains(&billing, id).await.unwrap(), "rolled back");

        let copies = (0..6).map(|_| {
            let (inbox, billing, bump) = (inbox.clone(), billing.clone(), bump.clone());
            tokio::spawn(async move {
                inbox
                    .process(&billing, id, move |tx| {
                        Box::pin(async move {
                            sqlx::query(&bump).execute(&mut *tx).await.map_err(|e| {
                                Error::new(ErrorKind::Storage, "bump").with_source(e)
                            })?;
                            Ok(())
                        })
                    })
                    .await
                    .unwrap()
            })
        });
        let outcomes =
            outbox_testkit::within("concurrent copies", futures::future::join_all(copies)).await;
        let applied = outcomes
            .into_iter()
            .filter(|o| *o.as_ref().unwrap() == Processed::Applied(()))
            .count();
        assert_eq!(applied, 1);
        let n: i32 = sqlx::query_scalar(&format!("SELECT n FROM {counter} WHERE id = 1"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            n, 1,
            "the effect committed once; the failed run left nothing"
        );
    }
}
