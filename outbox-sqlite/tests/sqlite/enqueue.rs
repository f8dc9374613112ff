//! Enqueue shares the caller's transaction: it commits and rolls back with the
//! business rows, and a refused batch leaves the transaction usable.

use outbox_core::{store::ClaimRequest, ErrorKind, OutboxStore};

use crate::{common, msg, outbox, rows, LONG};

async fn orders_table(db: &common::TempDb) {
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL) STRICT")
        .execute(db.pool())
        .await
        .unwrap();
}

async fn orders(db: &common::TempDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn business_rows_and_messages_commit_and_roll_back_together() {
    let db = common::TempDb::new().await;
    let outbox = outbox(&db).await;
    orders_table(&db).await;

    let mut tx = db.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO orders (item) VALUES ('rolled back')")
        .execute(&mut *tx)
        .await
        .unwrap();
    outbox.enqueue(&mut tx, &[msg(1), msg(2)]).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!((orders(&db).await, rows(&outbox).await), (0, 0));

    let mut tx = db.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO orders (item) VALUES ('kept')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let kept = msg(3);
    outbox.enqueue_one(&mut tx, &kept).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!((orders(&db).await, rows(&outbox).await), (1, 1));
    let claimed = outbox
        .claim(ClaimRequest::new(10, LONG).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message.id, kept.id());
}

#[tokio::test]
async fn a_stored_id_refuses_the_batch_but_not_the_transaction() {
    let db = common::TempDb::new().await;
    let outbox = outbox(&db).await;
    orders_table(&db).await;
    let stored = msg(1);
    crate::enqueue(&outbox, std::slice::from_ref(&stored)).await;

    let mut tx = db.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO orders (item) VALUES ('before')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let fresh = msg(2);
    let err = outbox
        .enqueue(&mut tx, &[fresh.clone(), stored.clone()])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(err.ids(), &[stored.id()]);
    // The transaction goes on: later writes and the earlier one commit.
    sqlx::query("INSERT INTO orders (item) VALUES ('after')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(orders(&db).await, 2, "the business writes committed");
    assert_eq!(rows(&outbox).await, 1, "nothing of the refused batch");

    // Outside a transaction, too, a refused batch writes nothing.
    let mut conn = db.pool().acquire().await.unwrap();
    let err = outbox
        .enqueue(&mut conn, &[fresh.clone(), stored])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(rows(&outbox).await, 1);
    outbox.enqueue_one(&mut conn, &fresh).await.unwrap();
    assert_eq!(rows(&outbox).await, 2, "autocommitted on its own");
}

#[tokio::test]
async fn batches_larger_than_one_statement_keep_their_order() {
    let db = common::TempDb::new().await;
    let outbox = outbox(&db).await;
    let batch: Vec<_> = (0..2500).map(msg).collect();
    crate::enqueue(&outbox, &batch).await;
    let claimed = outbox
        .claim(ClaimRequest::new(3000, LONG).unwrap())
        .await
        .unwrap();
    let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
    let expected: Vec<_> = batch.iter().map(|m| m.id()).collect();
    assert_eq!(ids, expected, "slice order across statement chunks");

    // A stored id in the last chunk takes back the earlier chunks as well.
    let mut again: Vec<_> = (0..1500).map(msg).collect();
    again.push(batch[0].clone());
    let mut tx = db.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let err = outbox.enqueue(&mut tx, &again).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    tx.commit().await.unwrap();
    assert_eq!(rows(&outbox).await, 2500);
}

#[tokio::test]
async fn a_plain_begin_that_loses_the_write_race_is_a_retryable_contention() {
    let db = common::TempDb::new().await;
    let outbox = outbox(&db).await;
    crate::enqueue(&outbox, &[msg(0)]).await;
    // A deferred transaction reads first, so it holds a snapshot ...
    let mut reader = db.pool().begin().await.unwrap();
    let _: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", outbox.qualified_name()))
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    // ... another connection commits a write ...
    crate::enqueue(&outbox, &[msg(1)]).await;
    // ... and the snapshot can no longer become a writer.
    let err = outbox.enqueue(&mut reader, &[msg(2)]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contention, "{}", err.report());
    assert!(err.is_retryable());
    reader.rollback().await.unwrap();
    assert_eq!(rows(&outbox).await, 2);
}
