//! Access paths, read from SQLite's own `EXPLAIN QUERY PLAN` on a table with history:
//! claims read the partial due index, settles reach rows through the index on `id`,
//! and neither scans the table.

use std::time::Duration;

use outbox_core::{KeyOrder, Retention};
use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};

use crate::{common, enqueue, msg};

/// The plan of `sql` as SQLite prints it, one detail per line.
async fn plan(outbox: &SqliteOutbox, sql: &str, params: usize) -> String {
    let text = format!("EXPLAIN QUERY PLAN {sql}");
    let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&text);
    for _ in 0..params {
        query = query.bind("[]");
    }
    let rows = query.fetch_all(outbox.pool()).await.unwrap();
    rows.into_iter()
        .map(|(_, _, _, detail)| detail)
        .collect::<Vec<_>>()
        .join("\n")
}

async fn loaded(ordering: KeyOrder) -> (common::TempDb, SqliteOutbox) {
    let db = common::TempDb::new().await;
    let config = SqliteOutboxConfig::default()
        .with_ordering(ordering)
        .with_retention(Retention::Keep {
            window: Duration::from_secs(3600),
        });
    let outbox = SqliteOutbox::new(db.pool().clone(), config).unwrap();
    outbox.install().await.unwrap();
    let batch: Vec<_> = (0..500).map(msg).collect();
    enqueue(&outbox, &batch).await;
    // History: most rows dispatched, some dead.
    sqlx::query("UPDATE outbox_messages SET dispatched_at = 1 WHERE seq % 10 != 0")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("ANALYZE").execute(db.pool()).await.unwrap();
    (db, outbox)
}

#[tokio::test]
async fn claims_read_the_due_index_and_settles_go_by_id() {
    for ordering in [KeyOrder::Unordered, KeyOrder::PerKey] {
        let (_db, outbox) = loaded(ordering).await;
        let [select, update, complete] = outbox.claim_complete_sql();
        let claim = plan(&outbox, select, 2).await;
        assert!(
            claim.contains("USING INDEX outbox_messages_due"),
            "{ordering:?} claim:\n{claim}"
        );
        assert!(
            !claim.contains("SCAN c\n") && !claim.ends_with("SCAN c"),
            "{claim}"
        );
        if ordering == KeyOrder::PerKey {
            assert!(claim.contains("outbox_messages_key"), "{claim}");
        }
        let stamp = plan(&outbox, update, 3).await;
        assert!(stamp.contains("USING INTEGER PRIMARY KEY"), "{stamp}");
        let settle = plan(&outbox, complete, 2).await;
        assert!(
            settle.contains("USING INDEX sqlite_autoindex_outbox_messages_1 (id=?)"),
            "complete:\n{settle}"
        );
        assert!(
            !settle.contains("SCAN m"),
            "complete scans the table:\n{settle}"
        );
    }
}
