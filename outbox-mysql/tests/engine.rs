//! Engine-specific cases the shared suites cannot write: rows planted by hand with
//! content the crate never writes (zero dates, bad headers), and InnoDB locking.
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test engine`

#[macro_use]
mod common;

use std::time::{Duration, SystemTime};

use outbox_core::{
    store::ClaimRequest, DeadLetterFilter, DeadLetterPage, MessageId, NewMessage, OutboxAdmin,
    OutboxStore,
};
use outbox_mysql::{MySqlOutbox, MySqlOutboxConfig};
use sqlx::MySqlPool;

const LEASE: Duration = Duration::from_secs(30);

/// A fresh outbox on its own database, or `None` when the URL is unset.
async fn outbox(what: &str, config: MySqlOutboxConfig) -> Option<(MySqlPool, MySqlOutbox)> {
    let url = common::url(what)?;
    let pool = common::pool(&url, 4).await;
    let outbox =
        MySqlOutbox::new(pool.clone(), config.with_schema(common::schema_name())).expect("outbox");
    outbox.install().await.expect("install");
    Some((pool, outbox))
}

/// Enqueue `n` messages, committed; their ids in enqueue order.
async fn enqueue(outbox: &MySqlOutbox, n: usize) -> Vec<MessageId> {
    let messages: Vec<NewMessage> = (0..n)
        .map(|i| {
            NewMessage::builder("engine")
                .payload(format!("m{i}").into_bytes())
                .build()
                .expect("message")
        })
        .collect();
    let mut tx = outbox.pool().begin().await.expect("begin");
    outbox.enqueue(&mut tx, &messages).await.expect("enqueue");
    tx.commit().await.expect("commit");
    messages.iter().map(NewMessage::id).collect()
}

/// Write `set` on row `id` in a session that allows zero dates and invalid JSON
/// (`sql_mode = ''`), as another tool could.
async fn plant(pool: &MySqlPool, outbox: &MySqlOutbox, id: MessageId, set: &str) {
    let mut conn = pool.acquire().await.expect("acquire").detach();
    sqlx::raw_sql("SET SESSION sql_mode = ''")
        .execute(&mut conn)
        .await
        .expect("sql_mode");
    let sql = format!("UPDATE {} SET {set} WHERE id = ?", outbox.qualified_name());
    let done = sqlx::query(&sql)
        .bind(id.as_uuid())
        .execute(&mut conn)
        .await
        .expect("plant");
    assert_eq!(done.rows_affected(), 1, "{sql}");
}

mysql_test! {
    /// Zero dates, headers that are not an object and negative attempts do not stop a
    /// claim: the rows are dead-lettered with a reason (the zero due time sorts first in
    /// `<table>_due`, so before the fix every claim failed on it) and listed afterwards.
    async fn hand_written_poison_rows_are_dead_lettered_not_fatal(
        (pool, outbox) = outbox("engine poison", MySqlOutboxConfig::default())
    ) {
        let ids = enqueue(&outbox, 5).await;
        plant(
            &pool,
            &outbox,
            ids[0],
            "available_at = '0000-00-00 00:00:00'",
        )
        .await;
        plant(&pool, &outbox, ids[1], "created_at = '0000-00-00 00:00:00'").await;
        plant(&pool, &outbox, ids[2], "created_at = '2020-00-10 00:00:00'").await;
        plant(&pool, &outbox, ids[3], "headers = '[1]', attempts = -3").await;

        let claimed = outbox
            .claim(ClaimRequest::new(10, LEASE).expect("request"))
            .await
            .expect("a claim meeting poison rows succeeds");
        let got: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(got, [ids[4]]);
        assert_eq!(claimed.dead_lettered, 4);

        let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).expect("page");
        let dead = outbox.dead_letters(&page).await.expect("dead letters list");
        let mut listed: Vec<MessageId> = dead.iter().map(|d| d.message.id).collect();
        listed.sort();
        let mut expected = ids[..4].to_vec();
        expected.sort();
        assert_eq!(listed, expected);
        for letter in &dead {
            let reason = letter.message.last_error.as_deref().unwrap_or("");
            assert!(
                reason.starts_with("undecodable row") || reason.contains("date"),
                "{reason}"
            );
            assert!(letter.dead_at > SystemTime::UNIX_EPOCH);
        }
        let zero = dead
            .iter()
            .find(|d| d.message.id == ids[1])
            .expect("listed");
        assert_eq!(zero.message.created_at, SystemTime::UNIX_EPOCH);
    }

    /// A retention reaching past year 1000 saturates at the epoch instead of making the
    /// expiry `NULL`: before, `record` reported the id a duplicate while `contains` said no.
    async fn very_long_dedup_retention_still_remembers(
        pool = common::connect("engine dedup retention", 2)
    ) {
        let ten_thousand_years = Duration::from_secs(10_000 * 366 * 86_400);
        let store = common::dedup_store(&pool, ten_thousand_years)
            .await
            .expect("store");
        let consumer = outbox_core::ConsumerName::new("engine").expect("name");
        let id = MessageId::new();
        use outbox_core::{Dedup, DedupStore};
        assert_eq!(
            store.record(&consumer, id).await.expect("record"),
            Dedup::New
        );
        assert!(store.contains(&consumer, id).await.expect("contains"));
        assert_eq!(
            store.record(&consumer, id).await.expect("again"),
            Dedup::Duplicate
        );
    }

    /// The relay's pool keeps the caller's pool's timeouts and lifetimes.
    async fn relay_pool_copies_the_pool_options(url = common::service_url("engine relay pool")) {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(3)
            .min_connections(1)
            .idle_timeout(Duration::from_secs(7))
            .max_lifetime(Duration::from_secs(70))
            .connect_lazy(&url)
            .expect("pool");
        let outbox = MySqlOutbox::new(pool, MySqlOutboxConfig::default()).expect("outbox");
        let relay = outbox.relay_pool().options();
        assert_eq!(relay.get_max_connections(), 3);
        assert_eq!(relay.get_min_connections(), 1);
        assert_eq!(relay.get_idle_timeout(), Some(Duration::from_secs(7)));
        assert_eq!(relay.get_max_lifetime(), Some(Duration::from_secs(70)));
        let level: String = sqlx::query_scalar("SELECT @@tx_isolation")
            .fetch_one(outbox.relay_pool())
            .await
            .expect("isolation");
        assert_eq!(level, "READ-COMMITTED");
    }

    /// 10,000 messages (70,000 parameters) enqueue in one call; a batch that long whose
    /// last id is stored writes nothing and leaves the transaction usable.
    async fn ten_thousand_message_batches_are_all_or_nothing(
        (_pool, outbox) = outbox("engine big batch", MySqlOutboxConfig::default())
    ) {
        let batch = |n: usize| -> Vec<NewMessage> {
            (0..n)
                .map(|_| {
                    NewMessage::builder("big")
                        .payload(vec![1])
                        .build()
                        .expect("message")
                })
                .collect()
        };
        let first = batch(10_000);
        let mut tx = outbox.pool().begin().await.expect("begin");
        outbox
            .enqueue(&mut tx, &first)
            .await
            .expect("10,000 messages");
        tx.commit().await.expect("commit");
        assert_eq!(outbox.stats().await.expect("stats").pending, 10_000);

        let mut second = batch(9_999);
        second.push(first[9_999].clone());
        let mut tx = outbox.pool().begin().await.expect("begin");
        let err = outbox
            .enqueue(&mut tx, &second)
            .await
            .expect_err("a stored id");
        assert_eq!(err.kind(), outbox_core::ErrorKind::Conflict, "{err}");
        outbox
            .enqueue(&mut tx, &batch(1))
            .await
            .expect("the transaction goes on");
        tx.commit().await.expect("commit");
        assert_eq!(outbox.stats().await.expect("stats").pending, 10_001);
    }

    /// Two settles of the same leases given in opposite orders, at once: both succeed
    /// (they lock in id order, so one waits for the other instead of deadlocking) and
    /// each lease is applied by exactly one of them.
    async fn overlapping_settles_in_opposite_orders_do_not_deadlock(
        (_pool, outbox) = outbox("engine settles", MySqlOutboxConfig::default())
    ) {
        for _ in 0..10 {
            enqueue(&outbox, 40).await;
            let claimed = outbox
                .claim(ClaimRequest::new(40, LEASE).expect("request"))
                .await
                .expect("claim");
            let leases: Vec<outbox_core::store::Lease> = claimed.iter().map(|c| c.lease).collect();
            let reversed: Vec<outbox_core::store::Lease> = leases.iter().rev().copied().collect();
            let (done, released) =
                tokio::join!(outbox.complete(&leases), outbox.release(&reversed));
            let (done, released) = (done.expect("complete"), released.expect("release"));
            assert_eq!(done.applied + released.applied, leases.len());
            let left = outbox
                .claim(ClaimRequest::new(40, LEASE).expect("request"))
                .await
                .expect("claim the released");
            assert_eq!(left.len(), released.applied);
            let leases: Vec<outbox_core::store::Lease> = left.iter().map(|c| c.lease).collect();
            let done = outbox.complete(&leases).await.expect("done");
            assert_eq!(done.applied, leases.len());
        }
    }
}

/// How long a purge may take while another transaction holds one of its rows: far
/// below InnoDB's default `innodb_lock_wait_timeout` (50 s), which is what a purge that
/// waits on the row would take.
const NO_WAIT: Duration = Duration::from_secs(10);

/// The rows of `table`.
async fn rows(pool: &MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .expect("count")
}

mysql_test! {
    /// A purge of dispatched rows skips the one another transaction holds (before, the
    /// `DELETE ... JOIN (SELECT ... SKIP LOCKED)` waited on it: MariaDB ignores `SKIP
    /// LOCKED` in a derived table), deletes the others, and the held row once it is free.
    async fn purge_dispatched_skips_a_held_row(
        (pool, outbox) = outbox(
            "engine purge held",
            MySqlOutboxConfig::default().with_retention(outbox_core::Retention::Keep {
                window: Duration::from_secs(3600),
            }),
        )
    ) {
        let ids = enqueue(&outbox, 5).await;
        let t = outbox.qualified_name().to_string();
        sqlx::query(&format!(
            "UPDATE {t} SET dispatched_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR"
        ))
        .execute(&pool)
        .await
        .expect("dispatch");
        let mut holder = pool.begin().await.expect("begin");
        sqlx::query(&format!("SELECT 1 FROM {t} WHERE id = ? FOR UPDATE"))
            .bind(ids[2].as_uuid())
            .execute(&mut *holder)
            .await
            .expect("hold a row");
        let purged = tokio::time::timeout(NO_WAIT, outbox.purge_dispatched(Duration::ZERO, 100))
            .await
            .expect("the purge waited on the held row");
        assert_eq!(purged.expect("purge"), 4);
        let held: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {t} WHERE id = ?"))
            .bind(ids[2].as_uuid())
            .fetch_one(&pool)
            .await
            .expect("held row");
        assert_eq!((rows(&pool, &t).await, held), (1, 1));
        holder.rollback().await.expect("release");
        let purged = outbox.purge_dispatched(Duration::ZERO, 100).await;
        assert_eq!(purged.expect("purge the freed row"), 1);
        assert_eq!(rows(&pool, &t).await, 0);
    }

    /// A purge of expired dedup records skips the one another transaction holds, deletes
    /// the others, and the held one once it is free.
    async fn dedup_purge_skips_a_held_record(pool = common::connect("engine dedup purge held", 4)) {
        use outbox_core::DedupStore;
        let store = common::dedup_store(&pool, Duration::from_secs(60))
            .await
            .expect("store");
        let consumer = outbox_core::ConsumerName::new("held").expect("name");
        let ids: Vec<MessageId> = (0..5).map(|_| MessageId::new()).collect();
        for id in &ids {
            let recorded = store.record(&consumer, *id).await.expect("record");
            assert_eq!(recorded, outbox_core::Dedup::New);
        }
        let t = store.config().qualified_name().expect("name").to_string();
        sqlx::query(&format!(
            "UPDATE {t} SET processed_at = processed_at - INTERVAL 1 DAY"
        ))
        .execute(&pool)
        .await
        .expect("expire");
        let mut holder = pool.begin().await.expect("begin");
        sqlx::query(&format!(
            "SELECT 1 FROM {t} WHERE consumer = ? AND message_id = ? FOR UPDATE"
        ))
        .bind(consumer.as_str())
        .bind(ids[2].as_uuid())
        .execute(&mut *holder)
        .await
        .expect("hold a record");
        let purged = tokio::time::timeout(NO_WAIT, store.purge_expired(100))
            .await
            .expect("the purge waited on the held record");
        assert_eq!(purged.expect("purge"), 4);
        let held: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {t} WHERE consumer = ? AND message_id = ?"
        ))
        .bind(consumer.as_str())
        .bind(ids[2].as_uuid())
        .fetch_one(&pool)
        .await
        .expect("held record");
        assert_eq!((rows(&pool, &t).await, held), (1, 1));
        holder.commit().await.expect("release");
        let purged = store.purge_expired(100).await;
        assert_eq!(purged.expect("purge the freed record"), 1);
        assert_eq!(rows(&pool, &t).await, 0);
    }

    /// A settle touches only its own rows: while another transaction holds a row of a
    /// different batch (a held-lock batch sharing the table, a relay settling), completing
    /// half of a small table does not wait. (Its lock and delete took the ids as an `IN`
    /// list, which MariaDB plans as a scan when they are much of a small table; the scan
    /// waited on every row others held, and two settles could deadlock.)
    async fn a_settle_waits_for_no_row_but_its_own(
        (pool, outbox) = outbox("settles by primary key", MySqlOutboxConfig::default())
    ) {
        enqueue(&outbox, 20).await;
        sqlx::query(&format!("ANALYZE TABLE {}", outbox.qualified_name()))
            .execute(&pool)
            .await
            .unwrap();
        let claim = |n| outbox.claim(ClaimRequest::new(n, LEASE).unwrap());
        let mine: Vec<_> = claim(10).await.unwrap().iter().map(|c| c.lease).collect();
        let theirs = claim(10).await.unwrap().into_messages();
        let mut other = pool.begin().await.unwrap();
        sqlx::query(&format!(
            "SELECT id FROM {} WHERE id = ? FOR UPDATE",
            outbox.qualified_name()
        ))
        .bind(theirs[5].message.id.as_uuid())
        .execute(&mut *other)
        .await
        .unwrap();
        let done = tokio::time::timeout(Duration::from_secs(10), outbox.complete(&mine))
            .await
            .expect("the complete does not wait for a row of another batch")
            .unwrap();
        assert_eq!((done.applied, done.lost.len()), (10, 0));
        other.rollback().await.unwrap();
    }
}
