//! Per-key order on a real server: the head check's plan behind a deep blocked backlog,
//! and what requeueing a dead letter does to its key.

use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt,
    DeadLetterSelection, KeyOrder, NewMessage, OutboxAdmin, OutboxStore,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};

use crate::{enqueue, pg_outbox, table};

/// A lease that never lapses during a test.
pub(crate) const LONG: Duration = Duration::from_secs(300);

/// A per-key outbox's config.
pub(crate) fn per_key() -> PgOutboxConfig {
    PgOutboxConfig::default().with_ordering(KeyOrder::PerKey)
}

/// Message `n` of key `key`.
pub(crate) fn keyed(key: &str, n: usize) -> NewMessage {
    NewMessage::builder("pg.tests")
        .partition_key(key)
        .payload(format!("{key}/{n}").into_bytes())
        .build()
        .unwrap()
}

/// Bulk-load a skewed table: `others` rows spread over 4 keys, then the head of key
/// `hot` leased (in flight), then `backlog` due rows of `hot` behind it, all older
/// than the other keys' rows so a claim meets them first.
async fn load_blocked_backlog(outbox: &PgOutbox, others: i64, backlog: i64) {
    let t = table(outbox);
    let statements = [
        format!(
            "INSERT INTO {t} (id, destination, partition_key, payload, available_at) \
             SELECT gen_random_uuid(), 'd', 'k' || (g % 4), '\\x00', \
                 now() - interval '1 minute' \
             FROM generate_series(1, $1) AS g"
        ),
        format!(
            "INSERT INTO {t} (id, destination, partition_key, payload, available_at, \
                 lease_token, attempts) \
             SELECT gen_random_uuid(), 'd', 'hot', '\\x00', now() + interval '1 hour', \
                 gen_random_uuid(), 1 \
             FROM generate_series(1, $1) AS g"
        ),
        format!(
            "INSERT INTO {t} (id, destination, partition_key, payload, available_at) \
             SELECT gen_random_uuid(), 'd', 'hot', '\\x00', \
                 now() - interval '1 hour' + g * interval '1 millisecond' \
             FROM generate_series(1, $1) AS g"
        ),
    ];
    for (sql, rows) in statements.iter().zip([others, 1, backlog]) {
        sqlx::query(sql)
            .bind(rows)
            .execute(outbox.pool())
            .await
            .unwrap();
    }
    sqlx::query(&format!("ANALYZE {t}"))
        .execute(outbox.pool())
        .await
        .unwrap();
}

pg_test! {
    /// With one key dominating the statistics and its head in flight, the head check must
    /// still probe the `<table>_key` index per candidate. (Planned as a sequential scan, it
    /// rescanned the table for every blocked row: seconds per claim.)
    async fn head_check_uses_the_key_index_behind_a_blocked_backlog(
        (_, outbox) = pg_outbox("per-key claim plan", 2, per_key())
    ) {
        let claim = crate::plans::claim_statement(&outbox).await;
        load_blocked_backlog(&outbox, 2_000, 20_000).await;

        let plan = crate::plans::explain_claim(outbox.relay_pool(), &claim, 100).await;
        // The head check reads the table as `e`; the rest of the plan may use any access
        // path (a hash join over a small table is fine).
        let name = outbox.config().table();
        assert!(
            plan.contains(&format!("using {name}_key on {name} e ")),
            "the head check must probe {name}_key:\n{plan}"
        );
        assert!(
            !plan.contains(&format!("Seq Scan on {name} e ")),
            "the head check must not scan the table:\n{plan}"
        );

        let claimed = outbox
            .claim(ClaimRequest::new(100, LONG).unwrap())
            .await
            .unwrap();
        let mut keys: Vec<_> = claimed
            .iter()
            .map(|c| c.message.partition_key.clone().unwrap_or_default())
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            ["k0", "k1", "k2", "k3"],
            "only the heads of the free keys"
        );
    }

    /// Requeueing a dead letter under per-key order makes it claimable at once by its
    /// original `seq`, even while a later message of its key is in flight; the messages
    /// after that wait for both.
    async fn requeued_dead_head_is_claimable_beside_its_in_flight_successor(
        (_, outbox) = pg_outbox("per-key requeue", 2, per_key())
    ) {
        let batch: Vec<_> = (0..3).map(|n| keyed("k", n)).collect();
        enqueue(&outbox, &batch).await;

        let head = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        assert_eq!(head.len(), 1);
        outbox
            .fail_one(Failure::new(
                head[0].lease,
                "poison",
                Disposition::DeadLetter,
            ))
            .await
            .unwrap();
        let second = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].message.id, batch[1].id());

        let requeue = DeadLetterSelection::Ids(vec![batch[0].id()]);
        assert_eq!(outbox.requeue_dead(&requeue).await.unwrap(), 1);
        let requeued = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        let ids: Vec<_> = requeued.iter().map(|c| c.message.id).collect();
        assert_eq!(
            ids,
            vec![batch[0].id()],
            "the requeued head is claimed while its successor is still in flight; \
             the third message waits for both"
        );
        let stats = outbox.stats().await.unwrap();
        assert_eq!((stats.in_flight, stats.pending), (2, 1));
    }
}
