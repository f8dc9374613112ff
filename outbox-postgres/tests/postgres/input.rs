//! Bad input is a typed error, before any SQL runs and with nothing written; ids that
//! are already stored conflict without aborting the caller's transaction.

use std::time::Duration;

use outbox_core::admin::MAX_ADMIN_BATCH;
use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt,
    DeadLetterFilter, DeadLetterPage, DeadLetterSelection, ErrorKind, MessageId, MessageLimits,
    NewMessage, OutboxAdmin, OutboxStore, Retention,
};
use outbox_postgres::{spawn_listener, PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig};
use sqlx::postgres::PgPoolOptions;

use crate::{common, outbox, pg_outbox, row_count, table};

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
        PgOutboxConfig::default().with_table("Messages"),
        PgOutboxConfig::default().with_table("m; DROP TABLE x"),
        PgOutboxConfig::default().with_schema("a\"b"),
        PgOutboxConfig::default().with_schema(""),
        PgOutboxConfig::default().with_table("t".repeat(64)),
    ];
    for config in bad {
        let err = PgOutbox::new(pool.clone(), config.clone()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{config:?}");
        assert_eq!(
            config.qualified_name().unwrap_err().kind(),
            ErrorKind::Config
        );
    }
    let err =
        PgDedupStore::new(pool.clone(), PgDedupConfig::default().with_table("In-box")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);

    let err = spawn_listener(pool, "no spaces", outbox_core::Wakeup::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

pg_test! {
    async fn oversize_payload_and_bad_header_write_nothing(
        pool = common::connect("oversize payload and bad header", 2)
    ) {
        let mut limits = MessageLimits::default().with_max_payload_bytes(16);
        limits.max_header_value_len = 8;
        let outbox = outbox(&pool, PgOutboxConfig::default().with_limits(limits)).await;

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
}

/// Create `<schema>.orders`, a business table for the transaction tests.
async fn business_table(outbox: &PgOutbox) -> String {
    let orders = format!("\"{}\".orders", outbox.config().schema());
    sqlx::query(&format!("CREATE TABLE {orders} (id bigint PRIMARY KEY)"))
        .execute(outbox.pool())
        .await
        .unwrap();
    orders
}

pg_test! {
    /// An id already stored by a committed transaction is reported as a
    /// conflict naming it, nothing of the batch is written, and the caller's transaction
    /// stays usable: the business write after it commits.
    async fn a_stored_id_conflicts_without_aborting_the_transaction(
        (pool, outbox) = pg_outbox("duplicate ids", 2, PgOutboxConfig::default())
    ) {
        let orders = business_table(&outbox).await;
        let first = crate::msg(0);
        crate::enqueue(&outbox, std::slice::from_ref(&first)).await;

        let fresh = crate::msg(1);
        let again = NewMessage::builder("d").id(first.id()).build().unwrap();
        let mut tx = pool.begin().await.unwrap();
        let err = outbox
            .enqueue(&mut tx, &[fresh.clone(), again])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert_eq!(err.ids(), &[first.id()], "{err}");
        assert!(err.to_string().contains("still usable"), "{err}");
        sqlx::query(&format!("INSERT INTO {orders} (id) VALUES (42)"))
            .execute(&mut *tx)
            .await
            .expect("the transaction is still usable after the conflict");
        tx.commit().await.unwrap();

        let order: i64 = sqlx::query_scalar(&format!("SELECT id FROM {orders}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(order, 42);
        let ids: Vec<uuid::Uuid> =
            sqlx::query_scalar(&format!("SELECT id FROM {}", table(&outbox)))
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            ids,
            [first.id().as_uuid()],
            "nothing of the batch was written"
        );
    }

    /// A batch naming an id twice is refused before anything is sent.
    async fn an_id_repeated_in_a_batch_is_refused_before_any_sql(
        (pool, outbox) = pg_outbox("repeated ids", 2, PgOutboxConfig::default())
    ) {
        let orders = business_table(&outbox).await;
        let twice = crate::msg(0);
        let mut tx = pool.begin().await.unwrap();
        let batch = [twice.clone(), crate::msg(1), twice.clone()];
        let err = outbox.enqueue(&mut tx, &batch).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert_eq!(err.ids(), &[twice.id()]);
        sqlx::query(&format!("INSERT INTO {orders} (id) VALUES (1)"))
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(row_count(&outbox).await, 0);
    }
}

/// Start an enqueue of `message` that waits for `first`, a transaction that enqueued
/// the same id and has not ended, and wait until it does; returns the enqueue's result
/// and the SQLSTATE (if any) of a statement run after it in the same transaction.
async fn enqueue_behind(
    outbox: &PgOutbox,
    application_name: &str,
    isolation: &'static str,
    message: &NewMessage,
) -> tokio::task::JoinHandle<(outbox_core::Result<()>, Option<String>, i64)> {
    let second = tokio::spawn({
        let (outbox, message) = (outbox.clone(), message.clone());
        async move {
            let mut tx = outbox.pool().begin().await.unwrap();
            sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {isolation}"))
                .execute(&mut *tx)
                .await
                .unwrap();
            // Take the snapshot now, before the first transaction commits.
            sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
            let result = outbox.enqueue(&mut tx, &[message]).await;
            let after: Result<i64, sqlx::Error> =
                sqlx::query_scalar(&format!("SELECT count(*) FROM {}", outbox.qualified_name()))
                    .fetch_one(&mut *tx)
                    .await;
            let (code, seen) = match after {
                Ok(n) => (None, n),
                Err(e) => (
                    e.as_database_error()
                        .and_then(|d| d.code())
                        .map(|c| c.into_owned()),
                    -1,
                ),
            };
            (result, code, seen)
        }
    });
    common::wait_until("the second enqueue to wait on the first", || {
        let (pool, name) = (outbox.pool().clone(), application_name.to_owned());
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
            )
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap();
            waiting == 1
        }
    })
    .await;
    second
}

pg_test! {
    /// An id another transaction is inserting at the same moment: the enqueue waits for
    /// it and, once it commits, reports the id as stored, writing nothing and leaving the
    /// transaction usable (under READ COMMITTED, PostgreSQL's default).
    async fn an_id_committed_while_the_enqueue_waits_conflicts_without_aborting(
        url = common::service_url("concurrent duplicate ids")
    ) {
        let application_name = format!("obx-dup-{}", uuid::Uuid::new_v4().simple());
        let pool = common::pool_named(&url, 3, &application_name).await;
        let outbox = outbox(&pool, PgOutboxConfig::default()).await;
        let message = crate::msg(0);

        let mut first = pool.begin().await.unwrap();
        outbox
            .enqueue(&mut first, std::slice::from_ref(&message))
            .await
            .unwrap();
        let second = enqueue_behind(&outbox, &application_name, "READ COMMITTED", &message).await;
        first.commit().await.unwrap();

        let (result, code, seen) = second.await.unwrap();
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert_eq!(err.ids(), &[message.id()]);
        assert_eq!(code, None, "the transaction is still usable");
        assert_eq!(seen, 1, "only the first transaction's row");
        assert_eq!(row_count(&outbox).await, 1);
    }

    /// Under REPEATABLE READ, an id committed after the transaction took its snapshot
    /// cannot be skipped: PostgreSQL aborts with a serialization failure, which is
    /// reported as contention (retry the transaction).
    async fn under_repeatable_read_a_concurrent_duplicate_is_a_serialization_failure(
        url = common::service_url("concurrent duplicate ids, repeatable read")
    ) {
        let application_name = format!("obx-dup-{}", uuid::Uuid::new_v4().simple());
        let pool = common::pool_named(&url, 3, &application_name).await;
        let outbox = outbox(&pool, PgOutboxConfig::default()).await;
        let message = crate::msg(0);

        let mut first = pool.begin().await.unwrap();
        outbox
            .enqueue(&mut first, std::slice::from_ref(&message))
            .await
            .unwrap();
        let second = enqueue_behind(&outbox, &application_name, "REPEATABLE READ", &message).await;
        first.commit().await.unwrap();

        let (result, code, _) = second.await.unwrap();
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contention, "{err}");
        assert!(err.is_retryable());
        assert_eq!(
            code.as_deref(),
            Some("25P02"),
            "PostgreSQL aborted the transaction"
        );
        assert_eq!(row_count(&outbox).await, 1);
    }
}

#[tokio::test]
async fn invalid_admin_input_runs_no_sql() {
    let keep = Retention::Keep {
        window: Duration::from_secs(60),
    };
    let outbox = PgOutbox::new(
        unreachable_pool(),
        PgOutboxConfig::default().with_retention(keep),
    )
    .unwrap();
    assert_eq!(outbox.purge_dispatched(Duration::ZERO, 0).await.unwrap(), 0);
    let too_many = DeadLetterSelection::Ids(vec![MessageId::new(); MAX_ADMIN_BATCH + 1]);
    let none = DeadLetterSelection::Matching {
        filter: DeadLetterFilter::default(),
        limit: 0,
    };
    for selection in [&too_many, &none] {
        for result in [
            outbox.requeue_dead(selection).await,
            outbox.discard_dead(selection).await,
        ] {
            assert_eq!(result.unwrap_err().kind(), ErrorKind::InvalidInput);
        }
    }
    let empty = DeadLetterSelection::Ids(Vec::new());
    assert_eq!(outbox.requeue_dead(&empty).await.unwrap(), 0);
    assert_eq!(outbox.discard_dead(&empty).await.unwrap(), 0);
}

pg_test! {
    /// A limit or age beyond what PostgreSQL can take means "all of them" / "nothing is
    /// that old", not bad input.
    async fn huge_limits_and_ages_are_clamped(pool = common::connect("huge limits", 2)) {
        let keep = Retention::Keep {
            window: Duration::from_secs(60),
        };
        let outbox = outbox(&pool, PgOutboxConfig::default().with_retention(keep)).await;
        crate::enqueue(&outbox, &[crate::msg(0), crate::msg(1)]).await;
        let claimed = outbox
            .claim(ClaimRequest::new(2, Duration::from_secs(60)).unwrap())
            .await
            .unwrap();
        outbox.complete_one(&claimed[0].lease).await.unwrap();
        let failure = Failure::new(claimed[1].lease, "dead", Disposition::DeadLetter);
        outbox.fail_one(failure).await.unwrap();

        let ten_thousand_years = Duration::from_secs(10_000 * 365 * 24 * 3600);
        for age in [Duration::MAX, ten_thousand_years] {
            let old = DeadLetterFilter::default().with_dead_for(age);
            let page = DeadLetterPage::new(old.clone(), MAX_ADMIN_BATCH).unwrap();
            assert!(
                outbox.dead_letters(&page).await.unwrap().is_empty(),
                "{age:?}"
            );
            let selection = DeadLetterSelection::Matching {
                filter: old,
                limit: MAX_ADMIN_BATCH,
            };
            assert_eq!(outbox.requeue_dead(&selection).await.unwrap(), 0);
            assert_eq!(
                outbox.purge_dispatched(age, usize::MAX).await.unwrap(),
                0,
                "nothing was dispatched {age:?} ago"
            );
        }
        let all = DeadLetterPage::new(DeadLetterFilter::default(), MAX_ADMIN_BATCH).unwrap();
        assert_eq!(outbox.dead_letters(&all).await.unwrap().len(), 1);
        assert_eq!(
            outbox
                .purge_dispatched(Duration::ZERO, usize::MAX)
                .await
                .unwrap(),
            1
        );
    }
}
