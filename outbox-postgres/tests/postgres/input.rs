//! Bad input is a typed error, before any SQL runs and with nothing written.

use std::time::Duration;

use outbox_core::{
    ClaimRequest, DedupStore, Disposition, DistributedLock, ErrorKind, Failure, MessageLimits,
    NewMessage, OutboxStore, OutboxStoreExt, Retention,
};
use outbox_postgres::{
    install, spawn_listener, PgAdvisoryLock, PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig,
};
use sqlx::postgres::PgPoolOptions;

use crate::{common, outbox, row_count};

/// A pool that cannot connect: any SQL would fail with `Unavailable`, not `Config`.
fn unreachable_pool() -> sqlx::PgPool {
    PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
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

#[tokio::test]
async fn zero_limits_run_no_sql() {
    let keep = Retention::Keep {
        window: Duration::from_secs(60),
    };
    let outbox = PgOutbox::new(
        unreachable_pool(),
        PgOutboxConfig::default().retention(keep),
    )
    .unwrap();
    assert!(outbox.dead_letters(None, 0).await.unwrap().is_empty());
    assert_eq!(outbox.purge_dispatched(Duration::ZERO, 0).await.unwrap(), 0);
    let inbox = PgDedupStore::new(unreachable_pool(), PgDedupConfig::default()).unwrap();
    assert_eq!(inbox.purge_expired(0).await.unwrap(), 0);
}

/// A limit or age beyond what PostgreSQL can take means "all of them" / "nothing is
/// that old", not bad input.
#[tokio::test]
async fn huge_limits_and_ages_are_clamped() {
    let Some(url) = common::url("huge limits") else {
        return;
    };
    let pool = common::pool(&url, 2).await;
    let keep = Retention::Keep {
        window: Duration::from_secs(60),
    };
    let outbox = outbox(&pool, PgOutboxConfig::default().retention(keep)).await;
    crate::enqueue(&outbox, &[crate::msg(0), crate::msg(1)]).await;
    let claimed = outbox
        .claim(ClaimRequest::new(2, Duration::from_secs(60)))
        .await
        .unwrap();
    outbox.complete_one(&claimed[0].lease).await.unwrap();
    outbox
        .fail_one(Failure {
            lease: claimed[1].lease,
            error: "dead".into(),
            disposition: Disposition::DeadLetter,
        })
        .await
        .unwrap();

    let dead = outbox.dead_letters(None, usize::MAX).await.unwrap();
    assert_eq!(dead.len(), 1);
    let ten_thousand_years = Duration::from_secs(10_000 * 365 * 24 * 3600);
    for age in [Duration::MAX, ten_thousand_years] {
        assert_eq!(
            outbox.purge_dispatched(age, usize::MAX).await.unwrap(),
            0,
            "nothing was dispatched {age:?} ago"
        );
    }
    assert_eq!(
        outbox
            .purge_dispatched(Duration::ZERO, usize::MAX)
            .await
            .unwrap(),
        1
    );

    let inbox = PgDedupStore::new(
        pool.clone(),
        PgDedupConfig::default().schema(outbox.config().schema_name()),
    )
    .unwrap();
    inbox.install().await.unwrap();
    assert_eq!(inbox.purge_expired(usize::MAX).await.unwrap(), 0);
}
