//! Bad input is a typed error, before any SQL runs and with nothing written.

use outbox_core::{DistributedLock, ErrorKind, MessageLimits, NewMessage};
use outbox_postgres::{
    install, spawn_listener, PgAdvisoryLock, PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig,
};
use sqlx::postgres::PgPoolOptions;

use crate::{common, outbox, row_count};

/// A pool that cannot connect: any SQL would fail with `Unavailable`, not `Config`.
fn unreachable_pool() -> sqlx::PgPool {
    PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap()
}

#[tokio::test]
async fn invalid_names_fail_before_any_sql() {
    let pool = unreachable_pool();
    let bad = [
        PgOutboxConfig::default().table("Messages"),
        PgOutboxConfig::default().table("m; DROP TABLE x"),
        PgOutboxConfig::default().schema("a\"b"),
        PgOutboxConfig::default().schema(""),
        PgOutboxConfig::default().table("t".repeat(64)),
    ];
    for config in bad {
        let err = PgOutbox::new(pool.clone(), config.clone()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{config:?}");
        let err = install(&pool, &config).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{config:?}");
    }
    let err =
        PgDedupStore::new(pool.clone(), PgDedupConfig::default().table("In-box")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);

    let err = spawn_listener(pool.clone(), "no spaces", outbox_core::Wakeup::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);

    let lock = PgAdvisoryLock::new(pool);
    for name in [String::new(), "n".repeat(201)] {
        let err = lock.try_lock(&name).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{name:?}");
    }
}

#[tokio::test]
async fn oversize_payload_and_bad_header_write_nothing() {
    let Some(url) = common::url("oversize payload and bad header") else {
        return;
    };
    let pool = common::pool(&url, 2).await;
    let mut limits = MessageLimits::default().with_max_payload_bytes(16);
    limits.max_header_value_len = 8;
    let outbox = outbox(&pool, PgOutboxConfig::default().limits(limits)).await;

    // Valid under the builder's default limits, too big for this outbox's.
    let oversize = NewMessage::builder("d")
        .payload(vec![1; 17])
        .build()
        .unwrap();
    let long_header = NewMessage::builder("d")
        .header("h", "123456789")
        .build()
        .unwrap();
    let valid = NewMessage::builder("d")
        .payload(vec![1; 16])
        .build()
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    for bad in [&oversize, &long_header] {
        let batch = [valid.clone(), (*bad).clone()];
        let err = outbox.enqueue(&mut tx, &batch).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
    // Nothing reached the server, so the transaction is still usable.
    tx.commit().await.unwrap();
    assert_eq!(row_count(&outbox).await, 0);

    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, &[valid]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(row_count(&outbox).await, 1);
}

#[tokio::test]
async fn duplicate_ids_conflict_and_write_nothing() {
    let Some(url) = common::url("duplicate ids") else {
        return;
    };
    let pool = common::pool(&url, 2).await;
    let outbox = outbox(&pool, PgOutboxConfig::default()).await;
    let first = crate::msg(0);
    let again = NewMessage::builder("d").id(first.id()).build().unwrap();
    crate::enqueue(&outbox, std::slice::from_ref(&first)).await;

    let mut tx = pool.begin().await.unwrap();
    let err = outbox
        .enqueue(&mut tx, &[crate::msg(1), again])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(row_count(&outbox).await, 1);
}
