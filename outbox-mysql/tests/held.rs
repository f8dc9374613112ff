//! Held-lock claims (`ClaimMode::HeldLock`) on MariaDB beyond the conformance suite,
//! which runs whole in that mode: a claim writes nothing to its rows, a batch whose
//! connection dies is claimable at once and charged its attempt, and the server ends a
//! batch left idle past its lease.
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test held`

#[macro_use]
mod common;

use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::ClaimedMessage, ClaimMode, ErrorKind, NewMessage, OutboxAdmin,
};
use outbox_core::{store::OutboxStoreExt, OutboxStore};
use outbox_mysql::{MySqlClaimConfig, MySqlOutbox, MySqlOutboxConfig};
use outbox_testkit::wait_until;
use sqlx::MySqlPool;

const LONG: Duration = Duration::from_secs(300);

/// A held-lock outbox in `schema` whose claims hold at most `connections` batches and
/// sweep before every claim.
async fn held_outbox(pool: &MySqlPool, schema: &str, connections: u32) -> MySqlOutbox {
    let config = MySqlOutboxConfig::default().with_schema(schema);
    let claims = MySqlClaimConfig::default()
        .with_claim_mode(ClaimMode::HeldLock)
        .with_held_connections(connections)
        .with_sweep_interval(Duration::ZERO);
    let outbox = MySqlOutbox::new(pool.clone(), config)
        .unwrap()
        .with_claims(claims);
    outbox.install().await.unwrap();
    outbox
}

async fn enqueue(outbox: &MySqlOutbox, count: usize) {
    let messages: Vec<NewMessage> = (0..count)
        .map(|i| {
            NewMessage::builder("held")
                .payload(vec![u8::try_from(i).unwrap()])
                .build()
                .unwrap()
        })
        .collect();
    let mut tx = outbox.pool().begin().await.unwrap();
    outbox.enqueue(&mut tx, &messages).await.unwrap();
    tx.commit().await.unwrap();
}

async fn claim(store: &MySqlOutbox, lease: Duration) -> Vec<ClaimedMessage> {
    store
        .claim(ClaimRequest::new(10, lease).unwrap())
        .await
        .unwrap()
        .into_messages()
}

/// The server's id of the one connection of `store`'s held pool (made with one
/// connection, so its next claim runs on it).
async fn held_connection_id(store: &MySqlOutbox) -> u64 {
    let (held, _) = store.held_pool().expect("held-lock mode");
    let mut conn = held.acquire().await.unwrap();
    sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

async fn connection_alive(pool: &MySqlPool, id: u64) -> bool {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    n > 0
}

/// End connection `id` as the server does when the process holding it dies, and wait
/// until it is gone.
async fn kill(pool: &MySqlPool, id: u64) {
    sqlx::query("KILL CONNECTION ?")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    wait_until("the killed connection to end", || async {
        !connection_alive(pool, id).await
    })
    .await;
}

async fn row(pool: &MySqlPool, store: &MySqlOutbox) -> (i32, bool, String) {
    let sql = format!(
        "SELECT attempts, lease_token IS NULL, CAST(available_at AS CHAR) FROM {}",
        store.qualified_name()
    );
    sqlx::query_as(&sql).fetch_one(pool).await.unwrap()
}

mysql_test! {
    /// The row a held claim takes keeps every column: the claim wrote nothing. Stats count
    /// the message in flight.
    async fn a_held_claim_writes_nothing_to_its_rows(
        pool = common::connect("held-lock claims", 4)
    ) {
        let store = held_outbox(&pool, &common::schema_name(), 2).await;
        enqueue(&store, 1).await;
        let before = row(&pool, &store).await;
        let got = claim(&store, LONG).await;
        assert_eq!(got[0].message.attempts, 1, "the attempt it starts");
        assert_eq!(row(&pool, &store).await, before, "the claim wrote nothing");
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.pending, stats.in_flight), (0, 1));
        store.complete_one(&got[0].lease).await.unwrap();
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.pending, stats.in_flight), (0, 0));
    }

    /// A batch whose connection dies is claimable at once, charged the attempt it
    /// started; its leases are lost; a message claimed through three dead connections
    /// starts its fourth attempt (a relay allowing three dead-letters it unpublished).
    async fn a_batch_whose_connection_dies_is_charged_and_claimable_at_once(
        pool = common::connect("held-lock claims", 4)
    ) {
        let schema = common::schema_name();
        let first = held_outbox(&pool, &schema, 1).await;
        enqueue(&first, 1).await;
        let id = held_connection_id(&first).await;
        let got = claim(&first, LONG).await;
        assert_eq!(got[0].message.attempts, 1);
        kill(&pool, id).await;
        let err = first.complete_one(&got[0].lease).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::LeaseLost,
            "the batch ended with its connection"
        );
        for attempt in 2..=3 {
            let store = held_outbox(&pool, &schema, 1).await;
            let id = held_connection_id(&store).await;
            let again = claim(&store, LONG).await;
            assert_eq!(again.len(), 1, "claimable at once");
            assert_eq!(
                again[0].message.attempts, attempt,
                "the dead batch was charged"
            );
            kill(&pool, id).await;
        }
        let last = held_outbox(&pool, &schema, 1).await;
        let again = claim(&last, LONG).await;
        assert_eq!(again[0].message.attempts, 4);
        last.complete_one(&again[0].lease).await.unwrap();
        assert_eq!(
            count(&pool, &format!("`{schema}`.`outbox_messages_held`")).await,
            0,
            "every batch's registry row is gone"
        );
    }

    /// A batch left idle past its lease has its connection ended by the server
    /// (`idle_transaction_timeout`), which releases its rows.
    async fn the_server_ends_a_batch_idle_past_its_lease(
        pool = common::connect("held-lock claims", 4)
    ) {
        let schema = common::schema_name();
        let store = held_outbox(&pool, &schema, 1).await;
        enqueue(&store, 1).await;
        let id = held_connection_id(&store).await;
        let got = claim(&store, Duration::from_secs(1)).await;
        assert_eq!(got.len(), 1);
        wait_until("the server to end the idle batch", || async {
            !connection_alive(&pool, id).await
        })
        .await;
        let err = store.complete_one(&got[0].lease).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
        let other = held_outbox(&pool, &schema, 1).await;
        let again = claim(&other, LONG).await;
        assert_eq!(again[0].message.attempts, 2, "the ended batch was charged");
    }

    /// Between its registry row's commit and its lock on that row, a batch is known alive
    /// only by its session's user-level lock (`obx-held-<batch>`): a sweep then passes
    /// over the row and charges nothing; once the lock is free (the session ended), the
    /// sweep charges the row's messages and deletes it.
    async fn a_sweep_passes_over_a_batch_whose_session_holds_its_lock(
        pool = common::connect("held-lock claims", 4)
    ) {
        let schema = common::schema_name();
        let store = held_outbox(&pool, &schema, 2).await;
        enqueue(&store, 3).await;
        let ids: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT LOWER(HEX(id)) FROM {} ORDER BY seq",
            store.qualified_name()
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        let batch = uuid::Uuid::now_v7().simple().to_string();
        // The batch's session: its lock taken, its registry row committed, no row lock yet.
        let mut session = pool.acquire().await.unwrap();
        let got: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(format!("obx-held-{batch}"))
            .fetch_one(&mut *session)
            .await
            .unwrap();
        assert_eq!(got, 1);
        sqlx::query(&format!(
            "INSERT INTO `{schema}`.`outbox_messages_held` (batch, ids, held_at) \
             VALUES (UNHEX(?), ?, UTC_TIMESTAMP(6))"
        ))
        .bind(&batch)
        .bind(serde_json::to_string(&ids).unwrap())
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(store.sweep_held().await.unwrap(), 0, "the batch lives");
        assert_eq!(row_attempts(&pool, &store).await, vec![0, 0, 0]);
        session.close().await.unwrap();
        assert_eq!(store.sweep_held().await.unwrap(), 3, "the batch ended");
        assert_eq!(row_attempts(&pool, &store).await, vec![1, 1, 1]);
        assert_eq!(
            count(&pool, &format!("`{schema}`.`outbox_messages_held`")).await,
            0
        );
    }
}

/// Rows of `table` (quoted).
async fn count(pool: &MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn row_attempts(pool: &MySqlPool, store: &MySqlOutbox) -> Vec<i32> {
    sqlx::query_scalar(&format!(
        "SELECT attempts FROM {} ORDER BY seq",
        store.qualified_name()
    ))
    .fetch_all(pool)
    .await
    .unwrap()
}

mysql_test! {
    /// Two held batches that each hold half of a small table complete at once: each
    /// complete reaches its own rows by primary key. (A `DELETE ... WHERE id IN (...)` of
    /// half the table is planned as a scan, which waits on the rows the other batch holds:
    /// the two batches deadlocked, and the loser published its messages again.)
    async fn batches_holding_most_of_a_small_table_complete_without_waiting(
        pool = common::connect("held-lock claims", 4)
    ) {
        let store = held_outbox(&pool, &common::schema_name(), 2).await;
        enqueue(&store, 20).await;
        sqlx::query(&format!("ANALYZE TABLE {}", store.qualified_name()))
            .execute(&pool)
            .await
            .unwrap();
        let first = claim(&store, LONG).await;
        let second = claim(&store, LONG).await;
        assert_eq!((first.len(), second.len()), (10, 10));
        let leases = |c: &[ClaimedMessage]| c.iter().map(|c| c.lease).collect::<Vec<_>>();
        let (a, b) = (leases(&first), leases(&second));
        let (done_a, done_b) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(store.complete(&a), store.complete(&b))
        })
        .await
        .expect("neither complete waits on the other batch's rows");
        assert!(done_a.unwrap().lost.is_empty());
        assert!(done_b.unwrap().lost.is_empty());
        assert_eq!(count(&pool, &store.qualified_name().to_string()).await, 0);
    }
}
