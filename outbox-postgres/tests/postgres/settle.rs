//! Settling on a real server: batches lock their rows in one order, so concurrent
//! settles of overlapping batches wait for each other instead of deadlocking.

use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::Lease, store::Settled,
    OutboxStore,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};

use crate::{common, table};

const LONG: Duration = Duration::from_secs(300);
const BATCH: usize = 40;

#[derive(Debug, Clone, Copy)]
enum Op {
    Complete,
    Fail,
    Release,
}

async fn settle(outbox: &PgOutbox, op: Op, leases: Vec<Lease>) -> outbox_core::Result<Settled> {
    match op {
        Op::Complete => outbox.complete(&leases).await,
        Op::Release => outbox.release(&leases).await,
        Op::Fail => {
            let failures: Vec<_> = leases
                .into_iter()
                .map(|lease| Failure::new(lease, "boom", Disposition::Retry { after: LONG }))
                .collect();
            outbox.fail(&failures).await
        }
    }
}

pg_test! {
    /// Two settles of the same leases, one given them in ascending id order and one in
    /// descending, both reach a row a third transaction holds. Were rows locked in the
    /// order given, each would hold what the other needs once the row is freed: a deadlock
    /// (SQLSTATE 40P01) after `deadlock_timeout`.
    async fn overlapping_batches_in_opposite_orders_do_not_deadlock(
        url = common::service_url("settle lock order")
    ) {
        let admin = common::pool(&url, 2).await;
        let application_name = format!("obx-settle-{}", uuid::Uuid::new_v4().simple());
        let pool = common::pool_named(&url, 4, &application_name).await;
        let config = PgOutboxConfig::default().with_schema(common::schema_name());
        let outbox = PgOutbox::new(pool, config).unwrap();
        outbox.install().await.unwrap();
        let t = table(&outbox);
        // Enough rows that settles probe the primary key per batch entry, in batch order,
        // rather than hash-joining a scan of the table.
        sqlx::query(&format!(
            "INSERT INTO {t} (id, destination, payload, available_at) \
             SELECT gen_random_uuid(), 'd', '\\x00', now() FROM generate_series(1, 20000)"
        ))
        .execute(&admin)
        .await
        .unwrap();
        sqlx::query(&format!("ANALYZE {t}"))
            .execute(&admin)
            .await
            .unwrap();

        for op in [Op::Complete, Op::Fail, Op::Release] {
            let mut leases: Vec<Lease> = outbox
                .claim(ClaimRequest::new(BATCH, LONG).unwrap())
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.lease)
                .collect();
            leases.sort_by_key(|l| l.id);
            let descending: Vec<Lease> = leases.iter().rev().copied().collect();

            let mut blocker = admin.begin().await.unwrap();
            sqlx::query(&format!("SELECT 1 FROM {t} WHERE id = $1 FOR UPDATE"))
                .bind(leases[BATCH / 2].id.as_uuid())
                .execute(&mut *blocker)
                .await
                .unwrap();
            let ascending = tokio::spawn({
                let (outbox, leases) = (outbox.clone(), leases.clone());
                async move { settle(&outbox, op, leases).await }
            });
            let descending = tokio::spawn({
                let outbox = outbox.clone();
                async move { settle(&outbox, op, descending).await }
            });
            common::wait_until("both settles to wait on row locks", || {
                let (admin, name) = (admin.clone(), application_name.clone());
                async move {
                    let waiting: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    )
                    .bind(name)
                    .fetch_one(&admin)
                    .await
                    .unwrap();
                    waiting == 2
                }
            })
            .await;
            blocker.rollback().await.unwrap();

            let a = ascending.await.unwrap();
            let b = descending.await.unwrap();
            let (a, b) = match (a, b) {
                (Ok(a), Ok(b)) => (a, b),
                (a, b) => panic!("{op:?}: a settle failed: {a:?} / {b:?}"),
            };
            let mut applied = [a.applied, b.applied];
            applied.sort_unstable();
            assert_eq!(applied, [0, BATCH], "{op:?}: one settle applies the batch");
            let lost = if a.applied == 0 { &a.lost } else { &b.lost };
            let requested: Vec<_> = if a.applied == 0 {
                leases.iter().map(|l| l.id).collect()
            } else {
                leases.iter().rev().map(|l| l.id).collect()
            };
            assert_eq!(
                lost, &requested,
                "{op:?}: lost leases in the caller's order"
            );
        }
    }

    /// The one-statement settle-and-claim does not wait while it holds rows it already
    /// wrote: when another transaction holds one of the batch's rows (as a claim whose
    /// snapshot was older holds a row it locked and then passed over, until its statement
    /// ends), the call is refused at once with a retryable `Contention`, nothing written,
    /// and the batch completes once the row is free. (Waiting, it deadlocked with such a
    /// claim: a one-second stall until `deadlock_timeout`.)
    async fn settle_and_claim_refuses_at_once_when_a_batch_row_is_held(
        url = common::service_url("settle and claim without waiting")
    ) {
        use outbox_core::{store::Settlement, ErrorKind};

        let admin = common::pool(&url, 2).await;
        let pool = common::pool(&url, 4).await;
        let config = PgOutboxConfig::default().with_schema(common::schema_name());
        let outbox = PgOutbox::new(pool, config).unwrap();
        outbox.install().await.unwrap();
        let messages: Vec<_> = (0..4).map(crate::msg).collect();
        crate::enqueue(&outbox, &messages).await;
        let claimed = outbox
            .claim(ClaimRequest::new(4, LONG).unwrap())
            .await
            .unwrap()
            .into_messages();
        let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
        let held = leases[2].id.as_uuid();
        let mut other = admin.begin().await.unwrap();
        sqlx::query(&format!(
            "SELECT 1 FROM {} WHERE id = $1 FOR UPDATE",
            table(&outbox)
        ))
        .bind(held)
        .execute(&mut *other)
        .await
        .unwrap();
        let next = ClaimRequest::new(4, LONG).unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            outbox.settle_and_claim(
                Settlement {
                    complete: &leases,
                    ..Settlement::default()
                },
                next,
            ),
        )
        .await
        .expect("the call does not wait for the held row")
        .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Contention, "{refused:?}");
        assert!(refused.is_retryable());
        assert_eq!(crate::row_count(&outbox).await, 4, "nothing was written");
        other.rollback().await.unwrap();
        let done = outbox.complete(&leases).await.unwrap();
        assert!(done.lost.is_empty());
        assert_eq!(crate::row_count(&outbox).await, 0);
    }
}
