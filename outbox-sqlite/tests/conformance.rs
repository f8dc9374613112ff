//! Every outbox-testkit suite against SQLite: the conformance suite with every case on
//! a database file of its own (the mode services use), and again on a private
//! in-memory database; the dedup, lock and idempotent-consumer suites over
//! [`SqliteDedupStore`], [`SqliteDistributedLock`] and [`SqliteEntityStore`] sharing
//! one database file per case, as the stores of a service would; the plan suite.
//!
//! Run: `cargo test -p outbox-sqlite --test conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::{
    store::StoreCapabilities, DedupStore, DistributedLock, MessageId, NewMessage, OutboxAdmin,
    OutboxStore, Result,
};
use outbox_sqlite::{
    SqliteDedupConfig, SqliteDedupStore, SqliteDistributedLock, SqliteEntityConfig,
    SqliteEntityStore, SqliteLockConfig, SqliteOutbox, SqliteOutboxConfig,
};
use outbox_testkit::{ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness};
use sqlx::SqlitePool;

/// Where each fixture's database lives.
#[derive(Debug, Clone, Copy)]
enum Storage {
    File,
    Memory,
}

/// Outboxes on the harness's storage, one database each; the other stores of a case
/// share the harness's database file.
struct SqliteHarness {
    storage: Storage,
    db: common::TempDb,
}

impl SqliteHarness {
    async fn new(storage: Storage) -> Option<SqliteHarness> {
        Some(SqliteHarness {
            storage,
            db: common::TempDb::new().await,
        })
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        Ok(Box::new(self.make(capabilities).await?))
    }
}

impl SqliteHarness {
    /// A fresh, installed outbox with these capabilities, on the harness's storage.
    async fn make(&self, capabilities: StoreCapabilities) -> Result<SqliteFixture> {
        let (pool, file) = match self.storage {
            Storage::File => {
                let db = common::TempDb::new().await;
                (db.pool().clone(), Some(db))
            }
            Storage::Memory => (outbox_sqlite::open_in_memory().await?, None),
        };
        let config = SqliteOutboxConfig::default()
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = SqliteOutbox::new(pool.clone(), config)?;
        outbox.install().await?;
        Ok(SqliteFixture {
            outbox,
            pool,
            _file: file,
        })
    }
}

#[derive(Debug)]
struct SqliteFixture {
    outbox: SqliteOutbox,
    pool: SqlitePool,
    _file: Option<common::TempDb>,
}

#[async_trait]
impl Fixture for SqliteFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.outbox.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(common::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await.map_err(common::storage)
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(common::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.rollback().await.map_err(common::storage)
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        let sql = format!(
            "UPDATE {} SET dispatched_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000000 \
             WHERE id = ?1",
            self.outbox.qualified_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid().as_bytes().to_vec())
            .execute(&self.pool)
            .await
            .map_err(common::storage)?;
        Ok(())
    }
}

impl SqliteHarness {
    async fn dedup_store(&self, retention: Duration) -> Result<SqliteDedupStore> {
        let config = SqliteDedupConfig::default()
            .with_table(format!("inbox_{}", uuid::Uuid::new_v4().simple()))
            .with_retention(retention);
        let store = SqliteDedupStore::new(self.db.pool().clone(), config)?;
        store.install().await?;
        Ok(store)
    }

    async fn lock(&self) -> Result<SqliteDistributedLock> {
        let lock = SqliteDistributedLock::new(self.db.pool().clone(), SqliteLockConfig::default())?;
        lock.install().await?;
        Ok(lock)
    }
}

#[async_trait]
impl ConsumerHarness for SqliteHarness {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        let config = SqliteEntityConfig::default()
            .with_table(format!("entities_{}", uuid::Uuid::new_v4().simple()));
        let store = SqliteEntityStore::new(self.db.pool().clone(), config)?;
        store.install().await?;
        Ok(Arc::new(store))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(self.dedup_store(retention).await?))
    }
}

#[async_trait]
impl DedupHarness for SqliteHarness {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(self.dedup_store(retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.lock().await?))
    }
}

#[async_trait]
impl LockHarness for SqliteHarness {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(SqliteHarness::lock(self).await?))
    }
}

/// Every suite with outboxes on database files. SQLite takes no row locks a claim could
/// skip, does not renew leases, and a lock holder's "session" is its renewal task and
/// lease, with no connection to sever.
mod file {
    async fn harness() -> Option<super::SqliteHarness> {
        super::SqliteHarness::new(super::Storage::File).await
    }

    outbox_testkit::backend_suites!(harness; lacks(row_locks, lease_renewal, sever));
}

/// The conformance suite again on private in-memory databases.
mod memory {
    async fn harness() -> Option<super::SqliteHarness> {
        super::SqliteHarness::new(super::Storage::Memory).await
    }

    outbox_testkit::conformance_suite!(harness; lacks(row_locks, lease_renewal));
}

/// The plan suite: the relay's statements on a table with history, read with
/// `EXPLAIN QUERY PLAN` (SQLite gathers no statistics unless told to `ANALYZE`).
mod plans {
    use outbox_testkit::{Access, History, PlanFixture, PlanHarness, PlannedStatement, RelayOp};

    use super::*;

    #[async_trait]
    impl PlanHarness for SqliteHarness {
        async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn PlanFixture>> {
            Ok(Box::new(self.make(capabilities).await?))
        }
    }

    /// The statements each operation sends (the store's own text, by name).
    fn statements(op: RelayOp) -> &'static [&'static str] {
        match op {
            RelayOp::Claim => &["claim_select", "claim_update", "dead_letter_claimed"],
            RelayOp::ClaimIds => &["claim_ids_select", "claim_update"],
            // SQLite settles, then claims: the trait's default.
            RelayOp::SettleAndClaim => &["complete", "claim_select", "claim_update"],
            RelayOp::Complete => &["complete"],
            RelayOp::Fail => &["fail"],
            RelayOp::Release => &["release"],
            RelayOp::Purge => &["purge_dispatched"],
            other => panic!("SQLite sends no statement for {other:?}"),
        }
    }

    /// How a line of `EXPLAIN QUERY PLAN` reaches the outbox table, if it does.
    /// Statements name the table `m`, `c`, `e` or by its name; `json_each` is the
    /// bound array and `SCAN` of a subquery reads its result, not the table.
    fn access(detail: &str, table: &str) -> Option<Access> {
        let mut words = detail.split_whitespace();
        let (verb, object) = (words.next()?, words.next()?);
        let ours = ["m", "c", "e", table].contains(&object.trim_matches('"'));
        if !ours {
            return None;
        }
        let rest = detail.split_once(object).map_or("", |(_, r)| r);
        match verb {
            "SCAN" => Some(Access::Scan(detail.to_owned())),
            "SEARCH" if rest.contains("INTEGER PRIMARY KEY") => Some(Access::ByKey),
            "SEARCH" if rest.contains("sqlite_autoindex") => Some(Access::ByKey),
            "SEARCH" => {
                let index = rest
                    .split_whitespace()
                    .skip_while(|w| *w != "INDEX")
                    .nth(1)
                    .unwrap_or(rest);
                Some(Access::Index(index.to_owned()))
            }
            _ => None,
        }
    }

    #[async_trait]
    impl PlanFixture for SqliteFixture {
        fn fixture(&self) -> &dyn Fixture {
            self
        }

        async fn add_history(&self, history: History) -> Result<()> {
            let t = self.outbox.qualified_name();
            let count = |n: usize| i64::try_from(n).expect("a small history");
            let (settled, dead) = (count(history.dispatched), count(history.dead));
            let due_end = settled + dead + count(history.due);
            let rows = due_end + count(history.waiting);
            let now = "CAST(strftime('%s', 'now') AS INTEGER) * 1000000";
            // Rows over eight keys, the first ones then stamped settled or dead; the
            // last ones due in an hour.
            let insert = format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO {t} (id, destination, partition_key, payload, created_at, \
                     available_at) \
                 SELECT randomblob(16), 'plans', 'k' || (i % 8), x'00', {now}, \
                     CASE WHEN i > ?2 THEN {now} + 3600000000 ELSE {now} - 60000000 END \
                 FROM n"
            );
            let dispatched = format!("UPDATE {t} SET dispatched_at = {now} WHERE seq <= ?1");
            let killed = format!("UPDATE {t} SET dead_at = {now} WHERE seq > ?1 AND seq <= ?2");
            let steps = [
                sqlx::query(&insert).bind(rows).bind(due_end),
                sqlx::query(&dispatched).bind(settled),
                sqlx::query(&killed).bind(settled).bind(settled + dead),
            ];
            for step in steps {
                step.execute(&self.pool).await.map_err(common::storage)?;
            }
            Ok(())
        }

        async fn plans(&self, op: RelayOp) -> Result<Vec<PlannedStatement>> {
            let table = self
                .outbox
                .qualified_name()
                .to_string()
                .trim_matches('"')
                .to_owned();
            let mut out = Vec::new();
            for name in statements(op) {
                let text = self
                    .outbox
                    .relay_sql(name)
                    .unwrap_or_else(|| panic!("no statement {name}"));
                let explain = format!("EXPLAIN QUERY PLAN {text}");
                let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
                for _ in 0..text.matches("?").count().min(9) {
                    query = query.bind("[]");
                }
                let rows = query.fetch_all(&self.pool).await.map_err(common::storage)?;
                let details: Vec<String> = rows.into_iter().map(|(_, _, _, d)| d).collect();
                out.push(PlannedStatement {
                    text: text.to_owned(),
                    variant: "query".to_owned(),
                    accesses: details.iter().filter_map(|d| access(d, &table)).collect(),
                    plan: details.join("\n"),
                });
            }
            Ok(out)
        }
    }

    async fn harness() -> Option<SqliteHarness> {
        SqliteHarness::new(Storage::File).await
    }

    outbox_testkit::plan_suite!(harness);
}
