//! SQL Server-specific tests beyond the shared suites: the installer and the DDL text,
//! enqueue conflicts under `XACT_ABORT`, batches larger than one statement, poison
//! rows written by hand. They need a server (`OUTBOX_TEST_MSSQL_URL`) and skip without.
//!
//! Run: `OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,1433;database=outbox_test;user id=sa;password=...;TrustServerCertificate=true' cargo test -p outbox-sqlserver --test sqlserver -- --nocapture`

#[path = "../common/mod.rs"]
mod common;

use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, DeadLetterFilter, DeadLetterPage, ErrorKind, MessageId, NewMessage,
    OutboxAdmin, OutboxStore,
};
use outbox_sqlserver::tiberius::Query;
use outbox_sqlserver::{MssqlOutbox, MssqlOutboxConfig, MssqlPool};

const LEASE: Duration = Duration::from_secs(60);

async fn setup(what: &str) -> Option<(MssqlPool, MssqlOutbox)> {
    let url = common::url(what)?;
    let connection = common::connection(&url);
    let pool = common::pool(&connection, 4).await;
    let config = MssqlOutboxConfig::default().with_schema(common::schema_name());
    let outbox = MssqlOutbox::new(pool.clone(), config).unwrap();
    Some((pool, outbox))
}

fn msg(n: usize) -> NewMessage {
    NewMessage::builder("sqlserver.tests")
        .payload(n.to_string().into_bytes())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn the_database_isolation_mode_is_reported() {
    let Some((pool, _)) = setup("sqlserver isolation mode").await else {
        return;
    };
    let mut client = pool.get().await.unwrap();
    let rows = client
        .simple_query(
            "SELECT CAST(is_read_committed_snapshot_on AS int) AS rcsi FROM sys.databases \
             WHERE name = DB_NAME()",
        )
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap();
    let rcsi: Option<i32> = rows.first().and_then(|r| r.get("rcsi"));
    eprintln!("READ_COMMITTED_SNAPSHOT of this database: {rcsi:?} (run the suites with both)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn install_is_idempotent_and_refuses_another_version() {
    let Some((pool, outbox)) = setup("sqlserver install").await else {
        return;
    };
    outbox.install().await.unwrap();
    outbox.install().await.unwrap();
    let name = outbox.qualified_name();
    let mut client = pool.get().await.unwrap();
    let mut bump = Query::new(format!(
        "UPDATE [{}].[outbox_schema_versions] SET version = 99 WHERE table_name = @P1",
        name.schema()
    ));
    bump.bind(name.table().to_owned());
    bump.execute(&mut *client).await.unwrap();
    let err = outbox.install().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Schema, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn the_ddl_text_runs_twice_as_one_batch() {
    let Some((pool, outbox)) = setup("sqlserver ddl text").await else {
        return;
    };
    let mut client = pool.get().await.unwrap();
    common::run(&mut client, &outbox.ddl()).await.unwrap();
    common::run(&mut client, &outbox.ddl()).await.unwrap();
    // The installer accepts what the text created.
    outbox.install().await.unwrap();
    let mut tx = pool.get().await.unwrap();
    common::run(&mut tx, "BEGIN TRANSACTION").await.unwrap();
    outbox.enqueue(&mut *tx, &[msg(1)]).await.unwrap();
    common::run(&mut tx, "COMMIT TRANSACTION").await.unwrap();
    assert_eq!(outbox.stats().await.unwrap().pending, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn a_conflicting_enqueue_leaves_the_transaction_usable_under_xact_abort() {
    let Some((pool, outbox)) = setup("sqlserver enqueue conflict").await else {
        return;
    };
    outbox.install().await.unwrap();
    let stored = msg(0);
    let mut client = pool.get().await.unwrap();
    common::run(&mut client, "BEGIN TRANSACTION").await.unwrap();
    outbox.enqueue_one(&mut *client, &stored).await.unwrap();
    common::run(&mut client, "COMMIT TRANSACTION")
        .await
        .unwrap();

    common::run(&mut client, "SET XACT_ABORT ON; BEGIN TRANSACTION")
        .await
        .unwrap();
    let fresh = msg(1);
    let err = outbox
        .enqueue(&mut *client, &[fresh.clone(), stored.clone()])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(err.ids(), &[stored.id()]);
    let later = msg(2);
    outbox.enqueue_one(&mut *client, &later).await.unwrap();
    common::run(&mut client, "COMMIT TRANSACTION; SET XACT_ABORT OFF")
        .await
        .unwrap();

    let claimed = outbox
        .claim(ClaimRequest::new(10, LEASE).unwrap())
        .await
        .unwrap();
    let ids: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    assert_eq!(
        ids,
        vec![stored.id(), later.id()],
        "the refused batch wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn batches_larger_than_one_statement_keep_order_and_stay_all_or_nothing() {
    let Some((pool, outbox)) = setup("sqlserver large batches").await else {
        return;
    };
    outbox.install().await.unwrap();
    // 700 messages: three enqueue statements (285 per statement).
    let batch: Vec<NewMessage> = (0..700).map(msg).collect();
    let mut client = pool.get().await.unwrap();
    common::run(&mut client, "BEGIN TRANSACTION").await.unwrap();
    outbox.enqueue(&mut *client, &batch).await.unwrap();
    common::run(&mut client, "COMMIT TRANSACTION")
        .await
        .unwrap();

    // A batch whose last chunk meets a stored id writes none of its chunks.
    let mut refused: Vec<NewMessage> = (700..1300).map(msg).collect();
    refused.push(batch[0].clone());
    common::run(&mut client, "BEGIN TRANSACTION").await.unwrap();
    let err = outbox.enqueue(&mut *client, &refused).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    common::run(&mut client, "COMMIT TRANSACTION")
        .await
        .unwrap();
    assert_eq!(outbox.stats().await.unwrap().pending, 700);

    // One claim of 2,500 is two statements below lock escalation; order is slice order.
    let mut more: Vec<NewMessage> = (2000..3800).map(msg).collect();
    common::run(&mut client, "BEGIN TRANSACTION").await.unwrap();
    outbox.enqueue(&mut *client, &more).await.unwrap();
    common::run(&mut client, "COMMIT TRANSACTION")
        .await
        .unwrap();
    let claimed = outbox
        .claim(ClaimRequest::new(2500, LEASE).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2500);
    let mut expected: Vec<MessageId> = batch.iter().map(NewMessage::id).collect();
    expected.extend(more.drain(..).map(|m| m.id()));
    let got: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    assert_eq!(got, expected[..2500]);
    let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
    let settled = outbox.complete(&leases).await.unwrap();
    assert_eq!((settled.applied, settled.lost.len()), (2500, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn rows_written_by_hand_that_do_not_decode_are_dead_lettered() {
    let Some((pool, outbox)) = setup("sqlserver poison rows").await else {
        return;
    };
    outbox.install().await.unwrap();
    let good = msg(1);
    let mut client = pool.get().await.unwrap();
    common::run(&mut client, "BEGIN TRANSACTION").await.unwrap();
    outbox.enqueue_one(&mut *client, &good).await.unwrap();
    common::run(&mut client, "COMMIT TRANSACTION")
        .await
        .unwrap();
    let poison = MessageId::new();
    let mut insert = Query::new(format!(
        "INSERT INTO {} (id, destination, payload, headers, available_at, attempts) \
         VALUES (@P1, N'd', 0x00, N'not json', SYSUTCDATETIME(), 0)",
        outbox.qualified_name()
    ));
    insert.bind(poison.as_uuid().as_bytes().to_vec());
    insert.execute(&mut *client).await.unwrap();

    let claimed = outbox
        .claim(ClaimRequest::new(10, LEASE).unwrap())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message.id, good.id());
    let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap();
    let dead = outbox.dead_letters(&page).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.id, poison);
    let reason = dead[0].message.last_error.clone().unwrap_or_default();
    assert!(reason.contains("headers"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn check_out_resets_what_a_caller_left_on_a_pooled_connection() {
    let Some(url) = common::url("sqlserver pool check-out") else {
        return;
    };
    // One connection, so the second check-out gets the same session.
    let pool = common::connection(&url).pool(1).await.unwrap();
    let mut client = pool.get().await.unwrap();
    common::run(
        &mut client,
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET IMPLICIT_TRANSACTIONS ON; \
         SET XACT_ABORT ON",
    )
    .await
    .unwrap();
    drop(client);
    let mut client = pool.get().await.unwrap();
    let rows = client
        .simple_query(
            "SELECT CAST(transaction_isolation_level AS int) AS level, \
             CAST(@@OPTIONS & 2 AS int) AS implicit, CAST(@@OPTIONS & 16384 AS int) AS xact_abort \
             FROM sys.dm_exec_sessions WHERE session_id = @@SPID",
        )
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap();
    let row = rows.first().expect("a row");
    assert_eq!(row.get::<i32, _>("level"), Some(2), "READ COMMITTED");
    assert_eq!(row.get::<i32, _>("implicit"), Some(0));
    assert_eq!(row.get::<i32, _>("xact_abort"), Some(0));
}

/// A batch whose second statement meets an id another transaction inserts and then
/// commits: with `READ_COMMITTED_SNAPSHOT` on, the insert fails with error 2627 (a
/// statement-level error that leaves the transaction open under `XACT_ABORT OFF`);
/// with it off, the `NOT EXISTS` check waits and then sees the id. Either way the call
/// fails with `Conflict` and takes back its first statement, so committing anyway
/// writes none of the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    outbox_service_unset,
    ignore = "OUTBOX_TEST_MSSQL_URL was not set when these tests were built"
)]
async fn a_racing_duplicate_leaves_none_of_the_batch_behind() {
    let Some((pool, outbox)) = setup("sqlserver racing duplicate").await else {
        return;
    };
    outbox.install().await.unwrap();
    let batch: Vec<NewMessage> = (0..300).map(msg).collect();
    let racing = batch[299].clone();

    let mut other = pool.get_owned().await.unwrap();
    let other_spid = session_id(&mut other).await;
    common::run(&mut other, "BEGIN TRANSACTION").await.unwrap();
    outbox.enqueue_one(&mut *other, &racing).await.unwrap();

    let mut mine = pool.get_owned().await.unwrap();
    let enqueuer = outbox.clone();
    let task = tokio::spawn(async move {
        common::run(&mut mine, "SET XACT_ABORT OFF; BEGIN TRANSACTION")
            .await
            .unwrap();
        let result = enqueuer.enqueue(&mut *mine, &batch).await;
        // Commit whatever is left, as a careless caller would.
        common::run(&mut mine, "IF @@TRANCOUNT > 0 COMMIT TRANSACTION")
            .await
            .unwrap();
        result
    });
    // Once the second statement waits on the other transaction's key (with
    // READ_COMMITTED_SNAPSHOT on or off, it must), commit that transaction.
    let blocked = format!(
        "SELECT CAST(COUNT(*) AS int) AS n FROM sys.dm_exec_requests \
         WHERE blocking_session_id = {other_spid}"
    );
    outbox_testkit::wait_until("the batch waiting on the other transaction", || {
        let (pool, blocked) = (pool.clone(), blocked.clone());
        async move {
            let mut watcher = pool.get().await.unwrap();
            count(&mut watcher, &blocked).await > 0
        }
    })
    .await;
    common::run(&mut other, "COMMIT TRANSACTION").await.unwrap();
    let err = task.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(
        outbox.stats().await.unwrap().pending,
        1,
        "only the other transaction's message"
    );
}

/// The session id (`@@SPID`) of `client`.
async fn session_id(client: &mut outbox_sqlserver::MssqlClient) -> i32 {
    count(client, "SELECT CAST(@@SPID AS int) AS n").await
}

/// The `int` column `n` of the one row `sql` returns.
async fn count(client: &mut outbox_sqlserver::MssqlClient, sql: &str) -> i32 {
    let rows = client
        .simple_query(sql)
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap();
    rows.first()
        .and_then(|row| row.get::<i32, _>("n"))
        .expect("one int row")
}
