//! Enqueue in the caller's transaction, as its own statement or inside the business
//! statement (`WalOutbox::enqueue_with`), against a private cluster with
//! `wal_level = logical`: what a relay streams afterwards is exactly what committed.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use outbox_core::{ErrorKind, MessageId, NewMessage};
use outbox_postgres_wal::WalOutbox;
use outbox_testkit::RecordingPublisher;

/// The ids a relay published, in order, once `marker` (committed last) arrived: had
/// anything else been emitted before it, it would be in the list too.
async fn published_through_marker(
    env: &Env,
    outbox: &WalOutbox,
    publisher: &RecordingPublisher,
    expected: usize,
) -> Vec<MessageId> {
    let relay = spawn(env, outbox, Arc::new(publisher.clone()), fast());
    let marker = messages("marker", 1, 1);
    commit(outbox, &marker).await;
    publisher
        .wait_for_unique(expected + 1, DEADLINE)
        .await
        .unwrap();
    relay.shutdown().await;
    let seen: Vec<MessageId> = publisher.published().iter().map(|p| p.id).collect();
    assert_eq!(seen.last(), Some(&marker[0].id()), "the marker comes last");
    seen[..seen.len() - 1].to_vec()
}

wal_test! {
    /// Enqueue's input rules (the core limits, repeated ids, no delays, empty batches):
    /// nothing sent for a refused batch, the transaction stays usable, and a relay gets
    /// only the good message. Install is idempotent.
    async fn enqueue_checks_input((env, outbox) = Env::with_outbox(&[])) {
        outbox.install().await.unwrap();
        let mut tx = outbox.pool().begin().await.unwrap();
        outbox.enqueue(&mut tx, &[]).await.unwrap();
        let m = NewMessage::builder("d").build().unwrap();
        let err = outbox
            .enqueue(&mut tx, &[m.clone(), m.clone()])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        let delayed = NewMessage::builder("d")
            .delay(Duration::from_secs(1))
            .build()
            .unwrap();
        let err = outbox.enqueue(&mut tx, &[delayed]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let small = outbox_postgres_wal::WalOutboxConfig::default()
            .with_slot(outbox.config().slot())
            .with_prefix(outbox.config().prefix())
            .with_limits(outbox_core::MessageLimits::default().with_max_payload_bytes(2));
        let strict = WalOutbox::new(outbox.pool().clone(), small).unwrap();
        let big = NewMessage::builder("d")
            .payload(vec![0; 3])
            .build()
            .unwrap();
        assert_eq!(
            strict.enqueue(&mut tx, &[big]).await.unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // Nothing failed on the server: the transaction is still usable.
        outbox
            .enqueue(&mut tx, std::slice::from_ref(&m))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let publisher = RecordingPublisher::new();
        let seen = published_through_marker(&env, &outbox, &publisher, 1).await;
        assert_eq!(seen, vec![m.id()]);
        assert!(dead_letters(&outbox).await.is_empty());
    }

    /// `enqueue_with`: the business statement runs once with its binds, its messages are
    /// emitted once whatever number of rows it changed, and a failing statement leaves
    /// neither its change nor its messages.
    async fn enqueue_with_emits_each_message_once_with_the_change(
        (env, outbox) = Env::with_outbox(&[])
    ) {
        let table = outbox_testkit::isolation::unique_name();
        sqlx::query(&format!(
            "CREATE TABLE {table} (id int8 PRIMARY KEY, n int8 NOT NULL)"
        ))
        .execute(outbox.pool())
        .await
        .unwrap();
        let batch = messages("orders", 2, 2);
        let one = messages("orders.paid", 1, 1);
        let none_changed = messages("orders.none", 1, 1);
        let refused = messages("orders.refused", 1, 1);

        // Three rows and two messages.
        let mut tx = outbox.pool().begin().await.unwrap();
        let insert = format!("INSERT INTO {table} (id, n) VALUES ($1, 1), ($2, 1), ($3, 1)");
        let statement = sqlx::query(&insert).bind(1_i64).bind(2_i64).bind(3_i64);
        outbox
            .enqueue_with(&mut tx, statement, &batch)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        // Three rows changed, one message; a trailing comment is fine.
        let mut tx = outbox.pool().begin().await.unwrap();
        let update = format!("UPDATE {table} SET n = n + $1 -- paid");
        outbox
            .enqueue_with(&mut tx, sqlx::query(&update).bind(10_i64), &one)
            .await
            .unwrap();
        // No row changed: the message is still emitted, once.
        let delete = format!("DELETE FROM {table} WHERE id = $1 ;\n");
        outbox
            .enqueue_with(&mut tx, sqlx::query(&delete).bind(99_i64), &none_changed)
            .await
            .unwrap();
        // No message: the statement alone.
        let add = format!("INSERT INTO {table} (id, n) VALUES ($1, $2)");
        outbox
            .enqueue_with(&mut tx, sqlx::query(&add).bind(4_i64).bind(7_i64), &[])
            .await
            .unwrap();
        // The caller's choice of a prepared statement or not holds for the wrapped one
        // (a statement text not run before, so not prepared already).
        let prepared = "SELECT count(*) FROM pg_prepared_statements \
                        WHERE statement LIKE 'WITH business AS%'";
        let before: i64 = sqlx::query_scalar(prepared)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert!(before >= 2, "the UPDATE and the DELETE were prepared");
        let noop = messages("orders.noop", 1, 1);
        let unprepared = format!("DELETE FROM {table} WHERE id = $1 AND n < 0");
        outbox
            .enqueue_with(
                &mut tx,
                sqlx::query(&unprepared).bind(1_i64).persistent(false),
                &noop,
            )
            .await
            .unwrap();
        let after: i64 = sqlx::query_scalar(prepared)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(after, before, "persistent(false) prepared nothing");
        tx.commit().await.unwrap();
        // A duplicate key: neither the change nor its message.
        let mut tx = outbox.pool().begin().await.unwrap();
        let err = outbox
            .enqueue_with(&mut tx, sqlx::query(&add).bind(4_i64).bind(0_i64), &refused)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{}", err.report());
        tx.rollback().await.unwrap();

        let rows: Vec<(i64, i64)> =
            sqlx::query_as(&format!("SELECT id, n FROM {table} ORDER BY id"))
                .fetch_all(outbox.pool())
                .await
                .unwrap();
        assert_eq!(rows, vec![(1, 11), (2, 11), (3, 11), (4, 7)]);
        let expected: Vec<MessageId> = batch
            .iter()
            .chain(&one)
            .chain(&none_changed)
            .chain(&noop)
            .map(NewMessage::id)
            .collect();
        let publisher = RecordingPublisher::new();
        let seen = published_through_marker(&env, &outbox, &publisher, expected.len()).await;
        assert_eq!(seen, expected, "each message once, in enqueue order");
    }

    /// `enqueue_with` refuses, before sending anything, a statement it could not run
    /// reliably (one a `WITH` would skip or PostgreSQL refuses to nest, one with an
    /// unbound placeholder) and a message `enqueue` refuses: the statement did not run and the transaction stays usable.
    async fn enqueue_with_refuses_before_sending((env, outbox) = Env::with_outbox(&[])) {
        let table = outbox_testkit::isolation::unique_name();
        sqlx::query(&format!("CREATE TABLE {table} (id int8 PRIMARY KEY)"))
            .execute(outbox.pool())
            .await
            .unwrap();
        let insert = format!("INSERT INTO {table} (id) VALUES ($1)");
        let good = messages("orders", 1, 1);
        let mut tx = outbox.pool().begin().await.unwrap();
        for sql in [
            format!("SELECT count(*) FROM {table} WHERE id > $1"),
            format!("WITH x AS (SELECT $1::int8 AS id) INSERT INTO {table} SELECT id FROM x"),
            format!("/* note */ INSERT INTO {table} (id) VALUES ($1)"),
            // $2 unbound: alone, the server would refuse it; here it would be the prefix.
            format!("INSERT INTO {table} (id) VALUES ($1 + length($2))"),
        ] {
            let err = outbox
                .enqueue_with(&mut tx, sqlx::query(&sql).bind(1_i64), &good)
                .await
                .unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::InvalidInput,
                "{sql}: {}",
                err.report()
            );
        }
        let delayed = NewMessage::builder("d")
            .delay(Duration::from_secs(1))
            .build()
            .unwrap();
        let err = outbox
            .enqueue_with(&mut tx, sqlx::query(&insert).bind(2_i64), &[delayed])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        // Nothing ran: the transaction is usable and the refused row is not there.
        outbox
            .enqueue_with(&mut tx, sqlx::query(&insert).bind(3_i64), &good)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let ids: Vec<i64> = sqlx::query_scalar(&format!("SELECT id FROM {table} ORDER BY id"))
            .fetch_all(outbox.pool())
            .await
            .unwrap();
        assert_eq!(ids, vec![3]);
        let publisher = RecordingPublisher::new();
        let seen = published_through_marker(&env, &outbox, &publisher, 1).await;
        assert_eq!(seen, vec![good[0].id()]);
    }
}
