//! The MariaDB / MySQL side of the chaos tests: the outbox in a database named like the
//! PostgreSQL schema that holds `published`, and the counts the checks read.

use outbox_core::KeyOrder;
use outbox_mysql::sqlx::MySqlPool;
use outbox_mysql::{MySqlOutbox, MySqlOutboxConfig};

use super::{Sent, TABLE};

/// The MySQL URL, or `None` after a visible skip.
pub(crate) fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url("OUTBOX_MYSQL_URL", what)
}

/// An installed outbox in database `schema`.
pub(crate) async fn install(url: &str, schema: &str, order: KeyOrder) -> MySqlOutbox {
    let pool = MySqlPool::connect(url).await.expect("connect to MySQL");
    let config = MySqlOutboxConfig::default()
        .with_schema(schema)
        .with_table(TABLE)
        .with_ordering(order);
    let outbox = MySqlOutbox::new(pool, config).expect("a valid outbox config");
    outbox.install().await.expect("install the outbox table");
    outbox
}

/// [`install`], with `<schema>.published` created on PostgreSQL (`pool`).
pub(crate) async fn install_with_published(
    pool: &sqlx::PgPool,
    url: &str,
    schema: &str,
    order: KeyOrder,
) -> MySqlOutbox {
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{schema}\"; {}",
        outbox_chaos::published_ddl(schema)
    ))
    .execute(pool)
    .await
    .expect("create the published table");
    install(url, schema, order).await
}

/// `count` messages over `keys` keys (every key used), in batches of 100, in order.
pub(crate) async fn enqueue_keyed(outbox: &MySqlOutbox, count: usize, keys: usize) -> Vec<Sent> {
    let (messages, sent) = super::keyed_messages(count, keys, &mut fastrand::Rng::new());
    for batch in messages.chunks(100) {
        let mut tx = outbox.pool().begin().await.expect("begin");
        outbox.enqueue(&mut tx, batch).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    sent
}

/// Rows matching `predicate` in the outbox table.
pub(crate) async fn count(outbox: &MySqlOutbox, predicate: &str) -> i64 {
    let sql = format!(
        "SELECT COUNT(*) FROM {} WHERE {predicate}",
        outbox.qualified_name()
    );
    sqlx::query_scalar(&sql)
        .fetch_one(outbox.pool())
        .await
        .expect("count outbox rows")
}

/// Drop the test's database.
pub(crate) async fn drop_database(outbox: &MySqlOutbox) {
    let sql = format!(
        "DROP DATABASE IF EXISTS {}",
        outbox.qualified_name().quoted_schema()
    );
    sqlx::raw_sql(&sql)
        .execute(outbox.pool())
        .await
        .expect("drop the test database");
}
