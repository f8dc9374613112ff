//! Installing: idempotent, versioned, and equivalent to applying `ddl()` by hand.

use outbox_core::{store::ClaimRequest, ErrorKind, OutboxStore};
use outbox_sqlite::{
    SqliteDedupConfig, SqliteDedupStore, SqliteDistributedLock, SqliteEntityConfig,
    SqliteEntityStore, SqliteLockConfig, SqliteOutbox, SqliteOutboxConfig,
};
use sqlx::Executor;

use crate::{common, enqueue, msg, LONG};

#[tokio::test]
async fn install_is_idempotent_and_refuses_another_layout_version() {
    let db = common::TempDb::new().await;
    let outbox = crate::outbox(&db).await;
    outbox.install().await.unwrap();
    enqueue(&outbox, &[msg(1)]).await;
    outbox.install().await.unwrap();
    assert_eq!(
        crate::rows(&outbox).await,
        1,
        "a second install keeps the rows"
    );

    sqlx::query("UPDATE outbox_schema_versions SET version = 99 WHERE table_name = ?1")
        .bind("outbox_messages")
        .execute(db.pool())
        .await
        .unwrap();
    let err = outbox.install().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Schema);
    assert!(
        err.message().contains("layout version 99"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn ddl_applied_by_hand_is_what_install_expects() {
    let db = common::TempDb::new().await;
    let config = SqliteOutboxConfig::default().with_table("hand_made");
    let outbox = SqliteOutbox::new(db.pool().clone(), config).unwrap();
    db.pool()
        .execute(sqlx::raw_sql(&outbox.ddl()))
        .await
        .unwrap();
    db.pool()
        .execute(sqlx::raw_sql(&outbox.ddl()))
        .await
        .unwrap();
    // The DDL alone makes a working outbox, recorded at this layout version ...
    enqueue(&outbox, &[msg(1)]).await;
    let version: i64 =
        sqlx::query_scalar("SELECT version FROM outbox_schema_versions WHERE table_name = ?1")
            .bind("hand_made")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(version, i64::from(outbox_sqlite::SCHEMA_VERSION));
    // ... which install then accepts as it is.
    outbox.install().await.unwrap();
    let claimed = outbox
        .claim(ClaimRequest::new(1, LONG).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);

    let inbox = SqliteDedupStore::new(db.pool().clone(), SqliteDedupConfig::default()).unwrap();
    let entities =
        SqliteEntityStore::new(db.pool().clone(), SqliteEntityConfig::default()).unwrap();
    let locks = SqliteDistributedLock::new(db.pool().clone(), SqliteLockConfig::default()).unwrap();
    for (ddl, table) in [
        (inbox.ddl(), "outbox_inbox"),
        (entities.ddl(), "outbox_entities"),
        (locks.ddl(), "outbox_locks"),
    ] {
        db.pool().execute(sqlx::raw_sql(&ddl)).await.unwrap();
        let version: i64 =
            sqlx::query_scalar("SELECT version FROM outbox_schema_versions WHERE table_name = ?1")
                .bind(table)
                .fetch_one(db.pool())
                .await
                .unwrap();
        assert_eq!(version, i64::from(outbox_sqlite::SCHEMA_VERSION), "{table}");
    }
    inbox.install().await.unwrap();
    entities.install().await.unwrap();
    locks.install().await.unwrap();
}

#[tokio::test]
async fn a_store_that_was_never_installed_reports_a_schema_error() {
    let db = common::TempDb::new().await;
    let outbox = SqliteOutbox::new(db.pool().clone(), SqliteOutboxConfig::default()).unwrap();
    let err = outbox
        .claim(ClaimRequest::new(1, LONG).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Schema, "{}", err.report());
    let mut conn = db.pool().acquire().await.unwrap();
    let err = outbox.enqueue(&mut conn, &[msg(1)]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Schema, "{}", err.report());
}

#[tokio::test]
async fn bad_names_are_refused_before_any_sql() {
    let db = common::TempDb::new().await;
    for table in ["x; DROP TABLE y", "Outbox", "1st", ""] {
        let config = SqliteOutboxConfig::default().with_table(table);
        let err = SqliteOutbox::new(db.pool().clone(), config).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{table:?}");
    }
}
