//! No row stops delivery: rows written by another tool that do not make a deliverable
//! message are dead-lettered by the claim that meets them, with the reason, and the
//! rest are delivered. `STRICT` tables refuse values of the wrong type outright.

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{
    store::ClaimRequest, DeadLetterFilter, DeadLetterPage, MessageId, MessageLimits, OutboxAdmin,
    OutboxStore,
};
use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};

use crate::{common, enqueue, msg, LONG};

/// Plant a due row with `set` applied; returns its id.
async fn plant(outbox: &SqliteOutbox, set: &str) -> MessageId {
    let id = MessageId::new();
    let t = outbox.qualified_name();
    sqlx::query(&format!(
        "INSERT INTO {t} (id, destination, payload, created_at, available_at) \
         VALUES (?1, 'sqlite.tests', x'00', 0, 0)"
    ))
    .bind(id.as_uuid().as_bytes().to_vec())
    .execute(outbox.pool())
    .await
    .unwrap();
    sqlx::query(&format!("UPDATE {t} SET {set} WHERE id = ?1"))
        .bind(id.as_uuid().as_bytes().to_vec())
        .execute(outbox.pool())
        .await
        .unwrap_or_else(|e| panic!("planting {set}: {e}"));
    id
}

#[tokio::test]
async fn undeliverable_rows_are_dead_lettered_with_the_reason() {
    let db = common::TempDb::new().await;
    let limits = MessageLimits::default().with_max_payload_bytes(64);
    let config = SqliteOutboxConfig::default().with_limits(limits);
    let outbox = SqliteOutbox::new(db.pool().clone(), config).unwrap();
    outbox.install().await.unwrap();
    let good: Vec<_> = (0..3).map(msg).collect();
    enqueue(&outbox, &good).await;
    let poisons = [
        ("headers = 'not json'", "headers are not JSON"),
        (r#"headers = '{"n": 1}'"#, "is not a string"),
        ("headers = '[]'", "not a JSON object"),
        ("attempts = -3", "attempts is -2"), // after the claim's own increment
        (
            &format!("attempts = {MAX_ATTEMPTS}") as &str,
            "reached the limit",
        ),
        ("payload = zeroblob(65)", "breaks the message rules"),
        ("destination = ''", "breaks the message rules"),
    ];
    let mut planted = Vec::new();
    for (set, reason) in poisons {
        planted.push((plant(&outbox, set).await, set, reason));
    }
    outbox.stats().await.unwrap();

    let claimed = outbox
        .claim(ClaimRequest::new(100, LONG).unwrap())
        .await
        .unwrap();
    let ids: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    let expected: Vec<MessageId> = good.iter().map(|m| m.id()).collect();
    assert_eq!(ids, expected, "the good rows, in order, and nothing else");

    let page = DeadLetterPage::new(DeadLetterFilter::default(), 100).unwrap();
    let dead = outbox.dead_letters(&page).await.unwrap();
    assert_eq!(dead.len(), planted.len());
    for (id, set, reason) in planted {
        let letter = dead.iter().find(|d| d.message.id == id).unwrap();
        let error = letter.message.last_error.as_deref().unwrap_or_default();
        assert!(error.contains(reason), "{set}: {error:?}");
    }
    assert_eq!(outbox.stats().await.unwrap().dead, 7);
}

#[tokio::test]
async fn strict_tables_refuse_values_of_the_wrong_type() {
    let db = common::TempDb::new().await;
    let outbox = crate::outbox(&db).await;
    let t = outbox.qualified_name();
    for (values, what) in [
        ("x'00', 'd', x'00', 0, 0", "a 1-byte id"),
        ("randomblob(16), 'd', 'text', 0, 0", "text as payload"),
        ("randomblob(16), 'd', x'00', 'soon', 0", "text as a time"),
        ("randomblob(16), 'd', x'00', 1.5, 0", "a fractional time"),
    ] {
        let err = sqlx::query(&format!(
            "INSERT INTO {t} (id, destination, payload, created_at, available_at) \
             VALUES ({values})"
        ))
        .execute(outbox.pool())
        .await
        .expect_err(what);
        assert!(err.as_database_error().is_some(), "{what}: {err}");
    }
    assert_eq!(crate::rows(&outbox).await, 0);
    let claimed = outbox
        .claim(ClaimRequest::new(1, LONG).unwrap())
        .await
        .unwrap();
    assert!(claimed.is_empty());
}

#[tokio::test]
async fn text_that_is_not_utf8_is_dead_lettered_and_still_listed() {
    let db = common::TempDb::new().await;
    let outbox = crate::outbox(&db).await;
    let good = msg(1);
    enqueue(&outbox, std::slice::from_ref(&good)).await;
    // A TEXT column, even in a STRICT table, takes bytes that are not UTF-8.
    let bad_destination = plant(&outbox, "destination = CAST(x'ff' AS TEXT)").await;
    let bad_headers = plant(&outbox, "headers = CAST(x'7b22ff223a2278227d' AS TEXT)").await;
    let claimed = outbox
        .claim(ClaimRequest::new(10, LONG).unwrap())
        .await
        .unwrap();
    let ids: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    assert_eq!(ids, [good.id()], "the bad rows do not stop the claim");

    let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap();
    let dead = outbox.dead_letters(&page).await.unwrap();
    let reason = |id: MessageId| {
        let letter = dead.iter().find(|d| d.message.id == id).unwrap();
        letter.message.last_error.clone().unwrap_or_default()
    };
    assert!(
        reason(bad_destination).contains("destination is not UTF-8"),
        "{}",
        reason(bad_destination)
    );
    assert!(reason(bad_headers).contains("headers is not UTF-8"));
    let listed = dead
        .iter()
        .find(|d| d.message.id == bad_destination)
        .unwrap();
    assert_eq!(listed.message.destination, "\u{fffd}", "listed lossily");
}
