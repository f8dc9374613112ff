//! The testkit's plan suite on MariaDB / MySQL: the statements each relay operation
//! sends (the store's own text), explained with `EXPLAIN FORMAT=JSON` on real ids,
//! after 100,000 rows of history were bulk-loaded with the table's statistics frozen
//! (`STATS_AUTO_RECALC = 0`, so InnoDB still believes the table empty).
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test plans`

#[macro_use]
mod common;

use async_trait::async_trait;
use outbox_core::Retention;
use outbox_core::{store::StoreCapabilities, Result};
use outbox_mysql::{MySqlOutbox, MySqlOutboxConfig};
use outbox_testkit::{
    Access, Fixture, History, PlanFixture, PlanHarness, PlannedStatement, RelayOp,
};
use serde_json::Value;
use sqlx::MySqlPool;
use uuid::Uuid;

/// A derived table of the digits 0 to 9 (`d`); five cross-joined count to 100,000.
const DIGITS: &str = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL \
                      SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";

struct MySqlPlanHarness {
    pool: MySqlPool,
}

#[async_trait]
impl PlanHarness for MySqlPlanHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn PlanFixture>> {
        let config = MySqlOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = MySqlOutbox::new(self.pool.clone(), config)?;
        outbox.install().await?;
        Ok(Box::new(common::MySqlFixture { outbox }))
    }
}

/// The statements an operation sends, by the store's names, each with how its
/// parameters are bound: `i` an integer, `t` a time, `b` an id or token (`h` as
/// hex), `s` text, `L` the id list, `F` the ids as the JSON rows of a fail.
fn statements(op: RelayOp) -> &'static [(&'static str, &'static str)] {
    const LOCK: (&str, &str) = ("lock", "iJ");
    const CLAIM: [(&str, &str); 2] = [("claim", "ii"), ("lease", "tbL")];
    match op {
        RelayOp::Claim => &[CLAIM[0], CLAIM[1], ("fail", "F")],
        RelayOp::ClaimIds => &[("claim_ids", "iLi"), CLAIM[1]],
        // The trait's default: complete, then claim.
        RelayOp::SettleAndClaim => &[LOCK, ("complete", "J"), CLAIM[0], CLAIM[1]],
        RelayOp::Complete => &[LOCK, ("complete", "J")],
        RelayOp::Fail => &[LOCK, ("fail", "F")],
        RelayOp::Release => &[LOCK, ("release", "L")],
        RelayOp::Renew => &[LOCK, ("renew", "tL")],
        // Lock through `<table>_dispatched`, then delete by primary key.
        RelayOp::Purge => &[("purge", "ii"), ("purge_delete", "J")],
        other => panic!("no statements listed for {other:?}"),
    }
}

/// Every access to `table` (by name or the claim's aliases) in a MySQL or MariaDB JSON
/// plan, in plan order.
fn accesses(plan: &Value, table: &str, out: &mut Vec<Access>) {
    match plan {
        Value::Object(map) => {
            let name = map.get("table_name").and_then(Value::as_str);
            if name.is_some_and(|n| [table, "c", "e"].contains(&n)) {
                let kind = map.get("access_type").and_then(Value::as_str).unwrap_or("");
                let key = map.get("key").and_then(Value::as_str).unwrap_or("");
                out.push(match (kind, key) {
                    ("ALL" | "index", _) | (_, "") => Access::Scan(format!("{kind} {key}")),
                    (_, "PRIMARY") => Access::ByKey,
                    (_, key) => Access::Index(key.to_owned()),
                });
            }
            map.values().for_each(|v| accesses(v, table, out));
        }
        Value::Array(items) => items.iter().for_each(|v| accesses(v, table, out)),
        _ => {}
    }
}

/// MariaDB prints binary literals in conditions raw, with control characters and
/// escapes JSON does not have: blank the former, double every backslash that does not
/// start a JSON escape.
fn valid_json(plan: &str) -> String {
    let mut out = String::with_capacity(plan.len());
    let cleaned = plan.replace(|c: char| c.is_control() && c != '\n', " ");
    let mut chars = cleaned.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '\\' {
            match chars.peek() {
                Some('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' | 'u') => {
                    out.extend(chars.next());
                }
                _ => out.push('\\'),
            }
        }
    }
    out
}

#[async_trait]
impl PlanFixture for common::MySqlFixture {
    fn fixture(&self) -> &dyn Fixture {
        self
    }

    async fn add_history(&self, history: History) -> Result<()> {
        let t = self.outbox.qualified_name();
        let rows = history.dispatched + history.dead + history.due + history.waiting;
        let (settled, dead) = (history.dispatched, history.dispatched + history.dead);
        let due_end = dead + history.due;
        let steps = [
            format!("ALTER TABLE {t} STATS_AUTO_RECALC = 0"),
            format!(
                "INSERT INTO {t} (id, destination, partition_key, payload, headers, created_at, \
                 available_at) \
                 SELECT UNHEX(REPLACE(UUID(), '-', '')), 'plans', CONCAT('k', n.i % 8), x'00', \
                     '{{}}', UTC_TIMESTAMP(6), IF(n.i > {due_end}, \
                     UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE) \
                 FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 1 AS i \
                       FROM {DIGITS} a, {DIGITS} b, {DIGITS} c, {DIGITS} e, {DIGITS} f) AS n \
                 WHERE n.i <= {rows} ORDER BY n.i"
            ),
            format!("UPDATE {t} SET dispatched_at = UTC_TIMESTAMP(6) WHERE seq <= {settled}"),
            format!(
                "UPDATE {t} SET dead_at = UTC_TIMESTAMP(6) WHERE seq > {settled} AND seq <= {dead}"
            ),
        ];
        for step in steps {
            sqlx::raw_sql(&step)
                .execute(self.outbox.pool())
                .await
                .map_err(common::storage)?;
        }
        Ok(())
    }

    async fn plans(&self, op: RelayOp) -> Result<Vec<PlannedStatement>> {
        let ids = self.backlog_ids().await?;
        let mut out = Vec::new();
        for (name, binds) in statements(op) {
            out.push(self.explain(name, binds, &ids).await?);
        }
        Ok(out)
    }
}

impl common::MySqlFixture {
    /// Due rows of the backlog: the ids a settle or a claim by id would name (a power
    /// of two, the length the store pads its id lists to).
    async fn backlog_ids(&self) -> Result<Vec<Uuid>> {
        let t = self.outbox.qualified_name();
        sqlx::query_scalar(&format!(
            "SELECT id FROM {t} WHERE due_at IS NOT NULL ORDER BY seq LIMIT 64"
        ))
        .fetch_all(self.outbox.pool())
        .await
        .map_err(common::storage)
    }

    /// The plan of the store's statement `name` with `binds` (see [`statements`]; `J`
    /// is `ids` as the JSON array the admin statements read).
    async fn explain(&self, name: &str, binds: &str, ids: &[Uuid]) -> Result<PlannedStatement> {
        let text = self
            .outbox
            .relay_sql(name, ids.len())
            .expect("a relay statement");
        let ids_json = serde_json::to_string(
            &ids.iter()
                .map(|id| id.simple().to_string())
                .collect::<Vec<_>>(),
        )
        .expect("json");
        let table = self.outbox.qualified_name().table();
        explain(self.outbox.pool(), table, name, text, binds, ids, &ids_json).await
    }
}

/// The plan of `text` on `table` with `binds` (see [`statements`]; `J` is `json`).
async fn explain(
    pool: &MySqlPool,
    table: &str,
    name: &str,
    text: String,
    binds: &str,
    ids: &[Uuid],
    json: &str,
) -> Result<PlannedStatement> {
    let explain = format!("EXPLAIN FORMAT=JSON {text}");
    let mut query = sqlx::query_scalar::<_, String>(&explain);
    for bind in binds.chars() {
        query = match bind {
            'i' => query.bind(100_i64),
            't' => query.bind(chrono::Utc::now().naive_utc()),
            'b' => query.bind(ids[0]),
            'h' => query.bind(ids[0].simple().to_string()),
            's' => query.bind("reason"),
            'L' => ids.iter().fold(query, |q, id| q.bind(*id)),
            'J' => query.bind(json),
            'F' => {
                let hex = |id: &Uuid| id.simple().to_string();
                let rows = ids
                    .iter()
                    .map(|id| serde_json::json!([hex(id), hex(id), "why", 0, 0]));
                query.bind(Value::from(rows.collect::<Vec<_>>()).to_string())
            }
            other => panic!("bind kind {other}"),
        };
    }
    let plan = query.fetch_one(pool).await.map_err(|e| {
        eprintln!("{name}: {e}");
        common::storage(e)
    })?;
    let json: Value = serde_json::from_str(&valid_json(&plan)).expect("a JSON plan");
    let mut found = Vec::new();
    accesses(&json, table, &mut found);
    Ok(PlannedStatement {
        text,
        variant: name.to_owned(),
        plan,
        accesses: found,
    })
}

async fn harness() -> Option<MySqlPlanHarness> {
    let url = common::url("outbox-mysql plans")?;
    Some(MySqlPlanHarness {
        pool: common::pool(&url, 4).await,
    })
}

outbox_testkit::plan_suite!(harness);

/// `outbox` installed with 100,000 rows of frozen history (40,000 dispatched, 40,000
/// dead, 10,000 due, 10,000 waiting), and 64 ids of the rows `chosen` picks (a
/// condition and an order).
async fn with_history(outbox: MySqlOutbox, chosen: &str) -> (common::MySqlFixture, Vec<Uuid>) {
    outbox.install().await.expect("install");
    let fixture = common::MySqlFixture { outbox };
    let history = History {
        dispatched: 40_000,
        dead: 40_000,
        due: 10_000,
        waiting: 10_000,
    };
    fixture.add_history(history).await.expect("history");
    let t = fixture.outbox.qualified_name();
    let ids = sqlx::query_scalar(&format!("SELECT id FROM {t} WHERE {chosen} LIMIT 64"))
        .fetch_all(fixture.outbox.pool())
        .await
        .expect("ids");
    (fixture, ids)
}

mysql_test! {
    /// The admin statements on the same history (not part of the kit's plan suite): those
    /// naming ids reach the table by primary key only (MariaDB before 11.1 has no
    /// semijoin for a single-table `UPDATE`/`DELETE`, so an `IN (JSON_TABLE)` there was a
    /// dependent subquery over `<table>_dead`); the others read `<table>_dead` or
    /// `<table>_dispatched`, never the whole table.
    async fn admin_statements_reach_rows_through_their_indexes(harness = harness()) {
        let config = MySqlOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_retention(Retention::Keep {
                window: std::time::Duration::from_secs(3600),
            });
        let outbox = MySqlOutbox::new(harness.pool.clone(), config).expect("outbox");
        let (fixture, dead) = with_history(outbox, "dead_flag = 1 ORDER BY id DESC").await;
        let t = fixture.outbox.qualified_name();
        let filter = "ssiiJJ";
        let cases = [
            ("requeue_ids", "J", true),
            ("discard_ids", "J", true),
            ("requeue_matching", &*format!("{filter}i"), false),
            ("discard_matching", &*format!("{filter}i"), false),
            ("count_dead", filter, false),
            ("count_dispatched", "i", false),
            ("purge", "ii", false),
            ("purge_delete", "J", true),
        ];
        let dispatched = Access::Index(format!("{}_dispatched", t.table()));
        for (name, binds, by_key) in cases {
            let planned = fixture.explain(name, binds, &dead).await.expect("plan");
            if name == "purge" {
                // Locks its rows through the purge index alone.
                assert_eq!(
                    planned.accesses,
                    std::slice::from_ref(&dispatched),
                    "{planned}"
                );
            }
            assert!(!planned.accesses.is_empty(), "{planned}");
            for access in &planned.accesses {
                match access {
                    Access::ByKey => {}
                    Access::Index(_) if !by_key => {}
                    other => panic!("{name} reads the table with {other:?}:\n{planned}"),
                }
            }
        }
    }

    /// The dedup purge on a table of 100,000 records, statistics frozen: its locking select
    /// reads `<table>_processed_at` alone, its delete reaches the records it names by
    /// primary key, the JSON keys read first.
    async fn dedup_purge_reads_its_index_then_the_primary_key(harness = harness()) {
        let store = common::dedup_store(&harness.pool, std::time::Duration::from_secs(60))
            .await
            .expect("store");
        let name = store.config().qualified_name().expect("name");
        let t = name.to_string();
        let steps = [
            format!("ALTER TABLE {t} STATS_AUTO_RECALC = 0"),
            format!(
                "INSERT INTO {t} (consumer, message_id, processed_at) \
                 SELECT CONCAT('c', n.i % 4), UNHEX(REPLACE(UUID(), '-', '')), \
                     UTC_TIMESTAMP(6) - INTERVAL n.i SECOND \
                 FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS i \
                       FROM {DIGITS} a, {DIGITS} b, {DIGITS} c, {DIGITS} e, {DIGITS} f) AS n"
            ),
        ];
        for step in steps {
            sqlx::raw_sql(&step)
                .execute(&harness.pool)
                .await
                .expect("history");
        }
        let keys: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT CAST(JSON_ARRAY(HEX(consumer), HEX(message_id)) AS CHAR) FROM {t} LIMIT 64"
        ))
        .fetch_all(&harness.pool)
        .await
        .expect("keys");
        let keys = format!("[{}]", keys.join(","));
        let [select, delete] = store.purge_sql();
        let index = Access::Index(format!("{}_processed_at", name.table()));
        for (text, binds, expected) in [(select, "ii", index), (delete, "J", Access::ByKey)] {
            let planned = explain(
                &harness.pool,
                name.table(),
                "dedup purge",
                text.to_owned(),
                binds,
                &[],
                &keys,
            )
            .await
            .expect("plan");
            assert_eq!(planned.accesses, [expected], "{planned}");
        }
    }
}

/// Every `(table or alias, access type, key)` of a MySQL or MariaDB JSON plan.
fn table_accesses(plan: &Value, out: &mut Vec<(String, String, String)>) {
    match plan {
        Value::Object(map) => {
            if let Some(name) = map.get("table_name").and_then(Value::as_str) {
                let field = |f: &str| map.get(f).and_then(Value::as_str).unwrap_or("");
                out.push((
                    name.to_owned(),
                    field("access_type").to_owned(),
                    field("key").to_owned(),
                ));
            }
            map.values().for_each(|v| table_accesses(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| table_accesses(v, out)),
        _ => {}
    }
}

mysql_test! {
    /// The held-lock statements on the same frozen history: every read of the outbox
    /// table (by name or the claim's aliases `c`, `e`, `m`) goes through an index, never a
    /// scan; the registry is reached by primary key where a statement names its batch. (The
    /// registry is read whole where a claim excludes registered ids and where a sweep picks
    /// rows: one row per open batch.)
    async fn held_statements_reach_rows_through_their_indexes(harness = harness()) {
        let config = MySqlOutboxConfig::default().with_schema(common::schema_name());
        let claims = outbox_mysql::MySqlClaimConfig::default()
            .with_claim_mode(outbox_core::ClaimMode::HeldLock);
        let outbox = MySqlOutbox::new(harness.pool.clone(), config)
            .expect("outbox")
            .with_claims(claims);
        let (fixture, due) = with_history(outbox, "due_at IS NOT NULL ORDER BY id").await;
        let t = fixture.outbox.qualified_name();
        let registry = format!("{}_held", t.table());
        // One registry row, for the statements that name their batch (the first due id).
        sqlx::query(&format!(
            "INSERT INTO {}.`{registry}` (batch, ids, held_at) VALUES (?, '[]', UTC_TIMESTAMP(6))",
            t.quoted_schema()
        ))
        .bind(due[0])
        .execute(fixture.outbox.pool())
        .await
        .expect("a registry row");
        let cases = [
            ("held_claim", "isii"),
            ("held_claim_ids", "isLii"),
            ("held_claim_excluding", "isLii"),
            ("held_complete", "J"),
            ("held_fail", "F"),
            ("held_hold", "h"),
            ("held_unregister", "b"),
            ("held_swept", ""),
            ("held_free", "J"),
            ("held_undelivered", "J"),
            ("held_charge", "J"),
            ("held_drop_batches", "J"),
            ("held_keep", "Jh"),
            ("held_stats", ""),
        ];
        for (name, binds) in cases {
            let planned = fixture.explain(name, binds, &due).await.expect("plan");
            let json: Value =
                serde_json::from_str(&valid_json(&planned.plan)).expect("a JSON plan");
            let mut found = Vec::new();
            table_accesses(&json, &mut found);
            let names_its_batch = ["held_hold", "held_unregister", "held_keep"].contains(&name);
            assert!(!found.is_empty(), "{planned}");
            for (table, kind, key) in &found {
                let outbox_table = [t.table(), "c", "e", "m"].contains(&table.as_str());
                if outbox_table {
                    assert!(
                        !matches!(kind.as_str(), "ALL" | "index") && !key.is_empty(),
                        "{name} reads {table} with {kind} {key}:\n{planned}"
                    );
                }
                if names_its_batch && (table == &registry || table == "b") {
                    assert_eq!(
                        key, "PRIMARY",
                        "{name} reads {table} with {kind}:\n{planned}"
                    );
                }
            }
        }
    }
}
