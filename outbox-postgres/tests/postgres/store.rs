//! Claims, fencing, undecodable rows and schema installation on a real server.

use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt,
    DeadLetterFilter, DeadLetterPage, ErrorKind, OutboxAdmin, OutboxStore, Retention,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use uuid::Uuid;

use crate::{common, enqueue, msg, pg_outbox, row_count, table};

const LONG: Duration = Duration::from_secs(300);

pg_test! {
    async fn completing_with_a_stale_lease_is_rejected_and_changes_nothing(
        (pool, outbox) = pg_outbox("stale lease", 4, PgOutboxConfig::default())
    ) {
        enqueue(&outbox, &[msg(0)]).await;

        let first = outbox
            .claim(ClaimRequest::new(1, Duration::from_millis(200)).unwrap())
            .await
            .unwrap();
        assert_eq!(first.len(), 1);
        let stale = first[0].lease;

        let second = common::poll_for("the expired lease to be claimed again", || {
            let outbox = outbox.clone();
            async move {
                let got = outbox
                    .claim(ClaimRequest::new(1, LONG).unwrap())
                    .await
                    .unwrap();
                (!got.is_empty()).then_some(got)
            }
        })
        .await;
        let current = second[0].lease;
        assert_ne!(stale.token, current.token);
        assert_eq!(second[0].message.attempts, 2);

        let err = outbox.complete_one(&stale).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
        assert_eq!(err.ids(), &[stale.id]);
        let failure = Failure::new(stale, "late", Disposition::DeadLetter);
        assert_eq!(
            outbox.fail_one(failure).await.unwrap_err().kind(),
            ErrorKind::LeaseLost
        );
        assert_eq!(
            outbox.release_one(&stale).await.unwrap_err().kind(),
            ErrorKind::LeaseLost
        );

        let (token, attempts, dead, error): (Option<Uuid>, i32, bool, Option<String>) =
            sqlx::query_as(&format!(
                "SELECT lease_token, attempts, dead_at IS NOT NULL, last_error FROM {}",
                table(&outbox)
            ))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            (token, attempts, dead, error),
            (Some(current.token.as_uuid()), 2, false, None),
            "the stale settles must not touch the row"
        );
        outbox.complete_one(&current).await.unwrap();
        assert_eq!(row_count(&outbox).await, 0);
    }

    async fn undecodable_rows_are_dead_lettered_not_wedging_claims(
        (pool, outbox) = pg_outbox("undecodable rows", 2, PgOutboxConfig::default())
    ) {
        let batch: Vec<_> = (0..4).map(msg).collect();
        enqueue(&outbox, &batch).await;
        let t = table(&outbox);
        for (id, headers) in [(batch[1].id(), r#"{"n": 1}"#), (batch[2].id(), "[1, 2]")] {
            sqlx::query(&format!("UPDATE {t} SET headers = $1::jsonb WHERE id = $2"))
                .bind(headers)
                .bind(id.as_uuid())
                .execute(&pool)
                .await
                .unwrap();
        }

        let claimed = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(
            ids,
            vec![batch[0].id(), batch[3].id()],
            "good rows, in order"
        );

        let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap();
        let dead = outbox.dead_letters(&page).await.unwrap();
        let mut dead_ids: Vec<_> = dead.iter().map(|d| d.message.id).collect();
        dead_ids.sort();
        assert_eq!(dead_ids, vec![batch[1].id(), batch[2].id()]);
        for d in &dead {
            let error = d.message.last_error.as_deref().unwrap_or_default();
            assert!(error.contains("undecodable row"), "{error}");
            assert!(d.message.headers.is_empty());
        }
        let stats = outbox.stats().await.unwrap();
        assert_eq!((stats.dead, stats.in_flight, stats.pending), (2, 2, 0));

        // Nothing is left to wedge the next claim.
        outbox
            .complete(&[claimed[0].lease, claimed[1].lease])
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert!(outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap()
            .is_empty());
    }

    /// A claim whose rows cannot be decoded at all (here a column of the wrong type, met
    /// only after the claim statement committed) fails with a decode error and gives every
    /// row it took back: not leased, attempt undone, due at once.
    async fn a_claim_that_cannot_be_decoded_gives_its_rows_back(
        (pool, outbox) = pg_outbox("undecodable claim", 2, PgOutboxConfig::default())
    ) {
        enqueue(&outbox, &(0..3).map(msg).collect::<Vec<_>>()).await;
        let t = table(&outbox);
        sqlx::query(&format!(
            "ALTER TABLE {t} ALTER COLUMN attempts TYPE bigint"
        ))
        .execute(&pool)
        .await
        .unwrap();

        let err = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Decode, "{err}");

        let (leased, attempted, not_due): (i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT count(*) FILTER (WHERE lease_token IS NOT NULL), \
                 count(*) FILTER (WHERE attempts <> 0), \
                 count(*) FILTER (WHERE available_at > now()) \
             FROM {t}"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            (leased, attempted, not_due),
            (0, 0, 0),
            "the failed claim must release what it took"
        );
        let stats = outbox.stats().await.unwrap();
        assert_eq!((stats.pending, stats.in_flight), (3, 0));
    }

    async fn install_is_idempotent_concurrent_and_versioned(
        pool = common::connect("schema install", 6)
    ) {
        let config = PgOutboxConfig::default().with_schema(common::schema_name());
        let outbox = PgOutbox::new(pool.clone(), config.clone()).unwrap();
        let installs = (0..4).map(|_| outbox.install());
        for result in futures::future::join_all(installs).await {
            result.unwrap();
        }
        outbox.install().await.unwrap();

        let versions = format!("\"{}\".outbox_schema_versions", config.schema());
        sqlx::query(&format!("UPDATE {versions} SET version = 99"))
            .execute(&pool)
            .await
            .unwrap();
        let err = outbox.install().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema);
        assert!(err.to_string().contains("version 99"), "{err}");
    }

    async fn ddl_text_installs_the_same_table(pool = common::connect("ddl text", 2)) {
        let config = PgOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_retention(Retention::Keep { window: LONG });
        let outbox = PgOutbox::new(pool.clone(), config).unwrap();
        sqlx::raw_sql(&outbox.ddl()).execute(&pool).await.unwrap();
        // The version is recorded, so install finds nothing to do.
        outbox.install().await.unwrap();
        enqueue(&outbox, &[msg(0)]).await;
        let claimed = outbox
            .claim(ClaimRequest::new(1, LONG).unwrap())
            .await
            .unwrap();
        outbox.complete_one(&claimed[0].lease).await.unwrap();
        assert_eq!(outbox.stats().await.unwrap().dispatched, 1);
    }

    async fn a_missing_table_is_a_schema_error(pool = common::connect("missing table", 2)) {
        let config = PgOutboxConfig::default().with_schema(common::schema_name());
        let outbox = PgOutbox::new(pool, config).unwrap();
        let err = outbox
            .claim(ClaimRequest::new(1, LONG).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema, "{err}");
        assert!(!err.is_retryable());
    }

    async fn large_batches_are_one_statement_and_keep_their_order(
        (_, outbox) = pg_outbox("large batch", 2, PgOutboxConfig::default())
    ) {
        let batch: Vec<_> = (0..2_000).map(msg).collect();
        enqueue(&outbox, &batch).await;
        let claimed = outbox
            .claim(ClaimRequest::new(2_000, LONG).unwrap())
            .await
            .unwrap();
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        let expected: Vec<_> = batch.iter().map(|m| m.id()).collect();
        assert_eq!(ids, expected);
        let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
        let settled = outbox.complete(&leases).await.unwrap();
        assert_eq!((settled.applied, settled.lost.len()), (2_000, 0));
    }

    /// A retry delay beyond what a timestamp can hold is taken as `MAX_DELAY` (about ten
    /// years) instead of failing the whole `fail` batch.
    async fn huge_retry_delays_are_capped_at_max_delay(
        (pool, outbox) = pg_outbox("huge retry delay", 2, PgOutboxConfig::default())
    ) {
        enqueue(&outbox, &[msg(0)]).await;
        let claimed = outbox
            .claim(ClaimRequest::new(1, LONG).unwrap())
            .await
            .unwrap();
        let failure = Failure::new(
            claimed[0].lease,
            "later",
            Disposition::Retry {
                after: Duration::MAX,
            },
        );
        outbox.fail_one(failure).await.unwrap();
        let years: f64 = sqlx::query_scalar(&format!(
            "SELECT extract(epoch FROM available_at - now())::float8 / (365 * 86400) FROM {}",
            table(&outbox)
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!((9.9..10.1).contains(&years), "due in {years} years");
    }

    /// Messages that never were rows (a log-tailing relay's refusals) are stored dead in one
    /// statement with every field kept; storing them again adds nothing; a requeue makes
    /// them ordinary rows a claim delivers.
    async fn messages_from_elsewhere_are_stored_as_dead_letters(
        (_, outbox) = pg_outbox("store dead letters", 4, PgOutboxConfig::default())
    ) {
        let created = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut headers = outbox_core::Headers::new();
        headers.insert("traceparent", "00-1");
        let letter = |n: u8, error: Option<&str>| {
            outbox_core::Message::from(outbox_core::backend::MessageParts {
                id: outbox_core::MessageId::new(),
                destination: format!("elsewhere.{n}"),
                partition_key: (n == 0).then(|| "k".to_owned()),
                payload: vec![n; 3],
                content_type: (n == 0).then(|| "application/json".to_owned()),
                headers: if n == 0 {
                    headers.clone()
                } else {
                    outbox_core::Headers::new()
                },
                created_at: created,
                attempts: u32::from(n) + 2,
                last_error: error.map(str::to_owned),
            })
        };
        let letters = vec![letter(0, Some("refused by the broker")), letter(1, None)];
        assert_eq!(outbox.store_dead_letters(&letters).await.unwrap(), 2);
        assert_eq!(outbox.store_dead_letters(&letters).await.unwrap(), 0);
        assert_eq!(outbox.store_dead_letters(&[]).await.unwrap(), 0);

        let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap();
        let mut dead = outbox.dead_letters(&page).await.unwrap();
        dead.sort_by(|a, b| a.message.destination.cmp(&b.message.destination));
        let stored: Vec<_> = dead.iter().map(|d| d.message.clone()).collect();
        assert_eq!(stored, letters);
        assert_eq!(row_count(&outbox).await, 2);

        let requeued = outbox
            .requeue_dead(&outbox_core::DeadLetterSelection::Ids(
                letters.iter().map(|m| m.id).collect(),
            ))
            .await
            .unwrap();
        assert_eq!(requeued, 2);
        let claimed = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        assert_eq!(claimed.len(), 2);
    }
}
