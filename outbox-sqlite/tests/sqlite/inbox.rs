//! The inbox's `process` on SQLite: the handler's writes and the dedup record commit
//! together or not at all, a repeat of the id is a duplicate, and a driver error names
//! SQLite's result code.

use futures::future::BoxFuture;
use futures::FutureExt;
use outbox_core::consumer::Processed;
use outbox_core::{ConsumerName, DedupStore, Error, ErrorKind, MessageId};
use outbox_sqlite::{SqliteDedupConfig, SqliteDedupStore};

use crate::common;

async fn applied(db: &common::TempDb) -> i64 {
    sqlx::query_scalar("SELECT n FROM applied WHERE id = 1")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// The handler's effect: one more in `applied`.
fn bump(tx: &mut sqlx::SqliteConnection) -> BoxFuture<'_, outbox_core::Result<()>> {
    async move {
        sqlx::query("UPDATE applied SET n = n + 1 WHERE id = 1")
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::new(ErrorKind::Storage, "bump").with_source(e))
            .map(drop)
    }
    .boxed()
}

#[tokio::test]
async fn process_commits_the_effect_and_the_record_together() {
    let db = common::TempDb::new().await;
    let inbox = SqliteDedupStore::new(db.pool().clone(), SqliteDedupConfig::default()).unwrap();
    inbox.install().await.unwrap();
    sqlx::raw_sql("CREATE TABLE applied (id INTEGER PRIMARY KEY, n INTEGER NOT NULL); INSERT INTO applied VALUES (1, 0)")
        .execute(db.pool())
        .await
        .unwrap();
    let (billing, id) = (ConsumerName::new("billing").unwrap(), MessageId::new());
    // A failing handler: its write and the record roll back together.
    let failed = inbox
        .process(&billing, id, |tx| {
            async move {
                bump(tx).await?;
                Err::<(), _>(Error::new(ErrorKind::Publish, "handler failed"))
            }
            .boxed()
        })
        .await;
    assert_eq!(failed.unwrap_err().kind(), ErrorKind::Publish);
    assert!(!inbox.contains(&billing, id).await.unwrap(), "rolled back");
    assert_eq!(applied(&db).await, 0);

    // Applied once, then a duplicate that runs nothing.
    let first = inbox.process(&billing, id, bump).await.unwrap();
    assert_eq!(first, Processed::Applied(()));
    assert!(inbox.contains(&billing, id).await.unwrap());
    let again: Processed<()> = inbox
        .process(&billing, id, |_| {
            panic!("a duplicate must not run the handler")
        })
        .await
        .unwrap();
    assert_eq!(again, Processed::Duplicate);
    assert_eq!(applied(&db).await, 1);
}

#[tokio::test]
async fn a_driver_error_names_the_result_code() {
    let db = common::TempDb::new().await;
    let inbox = SqliteDedupStore::new(db.pool().clone(), SqliteDedupConfig::default()).unwrap();
    // Not installed: the table is missing (SQLITE_ERROR, result code 1), which the
    // code table maps to a schema error.
    let err = inbox
        .contains(&ConsumerName::new("billing").unwrap(), MessageId::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Schema, "{}", err.report());
    assert!(
        err.to_string().contains("(SQLite code 1)"),
        "{}",
        err.report()
    );
}
