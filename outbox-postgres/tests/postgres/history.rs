//! Guarantee 8 on a real server: claims do not read dispatched history, and the purger
//! removes it in bounded batches under the advisory lock.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{DistributedLock, LockName, PurgeRun, Purger, Retention};
use outbox_postgres::{PgDistributedLock, PgOutbox, PgOutboxConfig};

use crate::{enqueue, msg, pg_outbox, table};

/// Bulk-load `n` dispatched rows, as months of kept history would look.
async fn load_history(outbox: &PgOutbox, n: i64) {
    sqlx::query(&outbox_testkit::postgres::history::insert_dispatched(
        &table(outbox),
    ))
    .bind(n)
    .execute(outbox.pool())
    .await
    .unwrap();
    sqlx::query(&format!("ANALYZE {}", table(outbox)))
        .execute(outbox.pool())
        .await
        .unwrap();
}

fn keep(window: Duration) -> PgOutboxConfig {
    PgOutboxConfig::default().with_retention(Retention::Keep { window })
}

pg_test! {
    async fn claims_read_the_pending_index_not_the_history(
        (_, outbox) = pg_outbox("claim plan over history", 2, keep(Duration::from_secs(3600)))
    ) {
        let claim = crate::plans::claim_statement(&outbox).await;
        load_history(&outbox, 100_000).await;
        enqueue(&outbox, &(0..20).map(msg).collect::<Vec<_>>()).await;

        let plan = crate::plans::explain_claim(outbox.relay_pool(), &claim, 100).await;
        let due_index = format!("{}_due", outbox.config().table());
        assert!(
            plan.contains(&due_index),
            "claim must use the partial index {due_index}:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan"),
            "claim must not scan the table:\n{plan}"
        );
    }

    async fn purger_deletes_expired_history_in_batches_under_the_lock(
        (pool, outbox) = pg_outbox("purger", 4, keep(Duration::from_secs(3600)))
    ) {
        load_history(&outbox, 2_500).await;
        enqueue(&outbox, &(0..5).map(msg).collect::<Vec<_>>()).await;

        let lock = Arc::new(PgDistributedLock::new(pool.clone()));
        let name = LockName::new(format!("purge-{}", outbox.config().schema())).unwrap();
        let purger = Purger::for_outbox(Arc::new(outbox.clone()), lock.clone(), 1_000)
            .unwrap()
            .with_lock_name(name.clone());

        let held = lock.try_lock(&name).await.unwrap().expect("lock is free");
        assert_eq!(
            purger.run_once().await.unwrap(),
            PurgeRun::Skipped,
            "another process purges"
        );
        held.unlock().await.unwrap();

        assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(2_500));
        let stats = outbox_core::OutboxAdmin::stats(&outbox).await.unwrap();
        assert_eq!(
            (stats.dispatched, stats.pending),
            (0, 5),
            "pending rows are never purged"
        );
    }
}
