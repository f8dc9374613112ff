//! The log-tailing relay against a private cluster with `wal_level = logical`.
//!
//! These are the relay, publisher and ordering cases of the conformance suite that apply
//! to a relay without claims (see the crate README's "Conformance" section for the map
//! and for the cases that do not apply).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use outbox_core::{
    DeadLetterFilter, DeadLetterPage, DeadLetterSelection, ErrorKind, MessageId, NewMessage,
    OutboxAdmin,
};
use outbox_postgres_wal::{WalOutbox, WalRelay, UNDECODABLE_DESTINATION};
use outbox_testkit::RecordingPublisher;
use tokio_util::sync::CancellationToken;

fn ids(messages: &[NewMessage]) -> Vec<MessageId> {
    messages.iter().map(NewMessage::id).collect()
}

/// Guarantee 1 and commit order: committed messages arrive, in commit order and
/// slice order, with every field; rolled-back ones and other transactions never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_committed_messages_in_commit_order() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let publisher = RecordingPublisher::new();
    let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());

    let first = messages("orders", 3, 2);
    commit(&outbox, &first).await;
    // A rolled-back enqueue publishes nothing.
    let mut tx = outbox.pool().begin().await.unwrap();
    let rolled_back = messages("orders", 2, 1);
    outbox.enqueue(&mut tx, &rolled_back).await.unwrap();
    tx.rollback().await.unwrap();
    // A transaction without messages, and a message under another prefix.
    sqlx::query("SELECT pg_logical_emit_message(true, 'someone_else', 'x')")
        .execute(outbox.pool())
        .await
        .unwrap();
    let full = NewMessage::builder("invoices")
        .partition_key("c-1")
        .content_type("application/json")
        .header("traceparent", "00-1")
        .payload(b"{}".to_vec())
        .build()
        .unwrap();
    let second = vec![full.clone()];
    commit(&outbox, &second).await;

    publisher.wait_for_unique(4, DEADLINE).await.unwrap();
    let published = publisher.published();
    let expected: Vec<MessageId> = ids(&first).into_iter().chain(ids(&second)).collect();
    assert_eq!(published.iter().map(|m| m.id).collect::<Vec<_>>(), expected);
    let last = published.last().unwrap();
    assert_eq!(last.destination, "invoices");
    assert_eq!(last.partition_key.as_deref(), Some("c-1"));
    assert_eq!(last.content_type.as_deref(), Some("application/json"));
    assert_eq!(last.headers.get("traceparent"), Some("00-1"));
    assert_eq!(last.payload, b"{}");
    assert_eq!(last.attempts, 1);
    let age = SystemTime::now()
        .duration_since(last.created_at)
        .unwrap_or_default();
    assert!(age < DEADLINE, "created_at is the commit time: {age:?} ago");
    let report = relay.shutdown().await;
    assert_eq!(report.published, 4);
    assert_eq!(report.dead_lettered, 0);
    assert!(rolled_back
        .iter()
        .all(|m| publisher.times_seen(m.id()) == 0));
}

/// Guarantee 4 with a graceful stop: the next relay starts after the confirmed position
/// and publishes only what is new, and the slot's lag falls back once it caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_the_confirmed_position() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let first = RecordingPublisher::new();
    let relay = spawn(&env, &outbox, Arc::new(first.clone()), fast());
    let batch = messages("d", 120, 3);
    commit(&outbox, &batch).await;
    first.wait_for_unique(120, DEADLINE).await.unwrap();
    relay.shutdown().await;

    // While no relay runs, the slot holds the new messages back: lag grows.
    let later = messages("d", 30, 3);
    for chunk in later.chunks(10) {
        commit(&outbox, chunk).await;
    }
    let lag = outbox.slot_status().await.unwrap().unwrap();
    assert!(!lag.active && !lag.invalidated);
    assert!(lag.lag_bytes.unwrap() > 0);

    let second = RecordingPublisher::new();
    let relay = spawn(&env, &outbox, Arc::new(second.clone()), fast());
    second.wait_for_unique(30, DEADLINE).await.unwrap();
    let seen: Vec<MessageId> = second.published().iter().map(|m| m.id).collect();
    assert_eq!(
        seen,
        ids(&later),
        "only the new messages, in order, once each"
    );
    relay.shutdown().await;
    wait_until(
        "the slot's confirmed position reaches the end of the log",
        || async {
            // Nothing new is committed, so the lag can only be the last records.
            outbox
                .slot_status()
                .await
                .unwrap()
                .unwrap()
                .lag_bytes
                .unwrap()
                < 4096
        },
    )
    .await;
}

/// Guarantee 4 with a crash: a relay task aborted mid-stream loses nothing; the next
/// relay publishes everything not confirmed, duplicates within the documented window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_relay_loses_nothing() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let all = messages("d", 600, 5);
    for chunk in all.chunks(20) {
        commit(&outbox, chunk).await;
    }
    let first = RecordingPublisher::new().with_delay(Duration::from_millis(5));
    let relay = spawn(
        &env,
        &outbox,
        Arc::new(first.clone()),
        fast().with_batch_size(20),
    );
    first.wait_for_unique(200, DEADLINE).await.unwrap();
    relay.task.abort();
    let _ = relay.task.await;

    let second = RecordingPublisher::new();
    let relay = spawn(&env, &outbox, Arc::new(second.clone()), fast());
    wait_until(
        "every message published by one relay or the other",
        || async {
            all.iter()
                .all(|m| first.times_seen(m.id()) > 0 || second.times_seen(m.id()) > 0)
        },
    )
    .await;
    relay.shutdown().await;
    let repeated = all
        .iter()
        .filter(|m| first.times_seen(m.id()) > 0 && second.times_seen(m.id()) > 0)
        .count();
    // The window: what was published since the last status update (50 ms at 20 per
    // 5 ms call is at most ~200) plus the batch in flight.
    assert!(repeated <= 260, "{repeated} republished");
    // The second relay starts where the first one's confirmed position was.
    let order: Vec<MessageId> = second.published().iter().map(|m| m.id).collect();
    let start = all.iter().position(|m| m.id() == order[0]).unwrap();
    assert_eq!(order, ids(&all[start..]));
}

/// Guarantee 5: a permanent refusal goes to the dead letters, which `OutboxAdmin`
/// lists and requeues (into the polling outbox's table); the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_refusals_become_dead_letters() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let publisher = RecordingPublisher::rejecting();
    let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
    let batch = messages("d", 3, 1);
    commit(&outbox, &batch).await;
    let admin = outbox.dead_letters();
    let filter = DeadLetterFilter::default();
    wait_until("three dead letters", || async {
        admin.count_dead(&filter).await.unwrap() == 3
    })
    .await;
    let report = relay.shutdown().await;
    assert_eq!(report.dead_lettered, 3);
    let letters = admin
        .dead_letters(&DeadLetterPage::new(filter.clone(), 10).unwrap())
        .await
        .unwrap();
    let mut expected = ids(&batch);
    expected.sort();
    assert_eq!(
        letters.iter().map(|l| l.message.id).collect::<Vec<_>>(),
        expected
    );
    assert_eq!(
        letters[0].message.last_error.as_deref(),
        Some("rejected by broker")
    );
    assert_eq!(letters[0].message.payload, batch[0].payload());
    // Requeued, they are ordinary pending rows of that table.
    let requeued = admin
        .requeue_dead(&DeadLetterSelection::Ids(vec![batch[0].id()]))
        .await
        .unwrap();
    assert_eq!(requeued, 1);
    assert_eq!(admin.stats().await.unwrap().pending, 1);
    // Nothing was confirmed past them twice: a new relay sees nothing again.
    let again = RecordingPublisher::new();
    let relay = spawn(&env, &outbox, Arc::new(again.clone()), fast());
    commit(&outbox, &messages("after", 1, 1)).await;
    again.wait_for_unique(1, DEADLINE).await.unwrap();
    relay.shutdown().await;
    assert_eq!(again.published_count(), 1);
}

/// Retries (guarantee 5) and per-key order (guarantee 6): retryable failures back off
/// and resume from the confirmed position; first publishes keep commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_back_off_and_keep_order() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let publisher = RecordingPublisher::failing_first(2);
    let relay = spawn(
        &env,
        &outbox,
        Arc::new(publisher.clone()),
        fast().with_batch_size(7),
    );
    let all = messages("d", 40, 4);
    for chunk in all.chunks(5) {
        commit(&outbox, chunk).await;
    }
    publisher.wait_for_unique(40, DEADLINE).await.unwrap();
    let report = relay.shutdown().await;
    assert_eq!(report.dead_lettered, 0);
    assert!(report.sessions > 1, "each retry resumed a new session");
    let firsts = publisher.first_publish_order_by_key();
    for (key, order) in firsts {
        let expected: Vec<MessageId> = all
            .iter()
            .filter(|m| m.partition_key() == Some(key.as_str()))
            .map(NewMessage::id)
            .collect();
        assert_eq!(order, expected, "key {key}");
    }
    // Attempts are counted: each message's first publish was its third hand-over.
    // (A message settled in a batch whose later message failed is republished after
    // the resume when its transaction was not wholly settled: a new count then.)
    let mut first_seen = std::collections::HashSet::new();
    for m in publisher.published() {
        if first_seen.insert(m.id) {
            assert_eq!(m.attempts, 3, "{:?}", m.id);
        }
    }
}

/// A message that keeps failing is dead-lettered after `max_attempts` and stops holding
/// the stream back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gives_up_after_max_attempts() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let publisher = RecordingPublisher::failing_destination("down");
    let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
    let stuck = messages("down", 1, 1);
    let behind = messages("up", 2, 1);
    commit(&outbox, &stuck).await;
    commit(&outbox, &behind).await;
    // The messages behind it may be handed over (and fail the batch) meanwhile: wait
    // for the dead letter and then for them.
    wait_until("the stuck message is dead-lettered", || async {
        outbox
            .dead_letters()
            .count_dead(&DeadLetterFilter::default())
            .await
            .unwrap()
            == 1
    })
    .await;
    publisher.wait_for_unique(2, DEADLINE).await.unwrap();
    let report = relay.shutdown().await;
    assert_eq!(report.dead_lettered, 1);
    let letters = outbox
        .dead_letters()
        .dead_letters(&DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap())
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.id, stuck[0].id());
    assert!(letters[0]
        .message
        .last_error
        .as_deref()
        .unwrap()
        .contains("gave up after 5 attempts"));
    assert_eq!(publisher.times_seen(stuck[0].id()), 5);
}

/// One active relay per slot: a second relay waits on the lock and takes over when the
/// first stops, from the first one's confirmed position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_per_slot() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let first = RecordingPublisher::new();
    let second = RecordingPublisher::new();
    let a = spawn(&env, &outbox, Arc::new(first.clone()), fast());
    commit(&outbox, &messages("d", 5, 1)).await;
    first.wait_for_unique(5, DEADLINE).await.unwrap();
    let b = spawn(&env, &outbox, Arc::new(second.clone()), fast());
    let more = messages("d", 5, 1);
    commit(&outbox, &more).await;
    first.wait_for_unique(10, DEADLINE).await.unwrap();
    assert_eq!(second.calls(), 0, "the standby publishes nothing");
    a.shutdown().await;
    let last = messages("d", 5, 1);
    commit(&outbox, &last).await;
    second.wait_for_unique(5, DEADLINE).await.unwrap();
    b.shutdown().await;
    let seen: Vec<MessageId> = second.published().iter().map(|m| m.id).collect();
    assert_eq!(seen, ids(&last));
}

/// Content under the outbox's prefix that does not decode is dead-lettered with its
/// raw bytes, never skipped; the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_content_is_dead_lettered() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
    let publisher = RecordingPublisher::new();
    let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
    sqlx::query("SELECT pg_logical_emit_message(true, $1, 'not a message'::bytea)")
        .bind(outbox.config().prefix())
        .execute(outbox.pool())
        .await
        .unwrap();
    commit(&outbox, &messages("d", 1, 1)).await;
    publisher.wait_for_unique(1, DEADLINE).await.unwrap();
    let report = relay.shutdown().await;
    assert_eq!(report.dead_lettered, 1);
    let letters = outbox
        .dead_letters()
        .dead_letters(&DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap())
        .await
        .unwrap();
    assert_eq!(letters[0].message.destination, UNDECODABLE_DESTINATION);
    assert_eq!(letters[0].message.payload, b"not a message");
}

/// An invalidated slot (the server dropped log it needed: `max_slot_wal_keep_size`)
/// stops the relay with an error that says so; it never skips ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_stops_the_relay() {
    let Some(env) = Env::start(&[("max_slot_wal_keep_size", "1MB")]).await else {
        return;
    };
    let outbox = env.outbox().await;
    commit(&outbox, &messages("d", 1, 1)).await;
    sqlx::raw_sql("CREATE TABLE filler (x text)")
        .execute(&env.pool)
        .await
        .unwrap();
    wait_until("the slot is invalidated", || async {
        sqlx::raw_sql(
            "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); \
             SELECT pg_switch_wal(); CHECKPOINT;",
        )
        .execute(&env.pool)
        .await
        .unwrap();
        outbox.slot_status().await.unwrap().unwrap().invalidated
    })
    .await;
    let relay = WalRelay::new(
        outbox.clone(),
        env.target(),
        Arc::new(RecordingPublisher::new()),
        fast(),
    )
    .unwrap();
    let err = tokio::time::timeout(DEADLINE, relay.run(CancellationToken::new()))
        .await
        .expect("the relay stops by itself")
        .unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().contains("invalidated"), "{}", err.report());
    // And install refuses to paper over it.
    assert!(outbox
        .install()
        .await
        .unwrap_err()
        .message()
        .contains("invalidated"));
}

/// Enqueue's input rules: the core limits, repeated ids, no delays, empty batches;
/// install is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_checks_input() {
    let Some(env) = Env::start(&[]).await else {
        return;
    };
    let outbox = env.outbox().await;
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
    outbox.enqueue(&mut tx, &[m]).await.unwrap();
    tx.commit().await.unwrap();
}

/// Install refuses a server without `wal_level = logical` (the shared test server runs
/// `replica`).
#[tokio::test]
async fn install_needs_logical_wal_level() {
    let Some(env) = Env::start(&[("wal_level", "replica")]).await else {
        return;
    };
    let outbox = WalOutbox::new(
        env.pool.clone(),
        outbox_postgres_wal::WalOutboxConfig::default(),
    )
    .unwrap();
    let err = outbox.install().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.message().contains("wal_level"));
}
