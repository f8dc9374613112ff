//! The log-tailing relay against a private cluster with `wal_level = logical`.
//!
//! These are the relay, publisher and ordering cases of the conformance suite that apply
//! to a relay without claims (see the crate README's "Conformance" section for the map
//! and for the cases that do not apply).

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use outbox_core::relay::metrics::{DEAD_LETTERED, DISPATCHED};
use outbox_core::{
    DeadLetterFilter, DeadLetterPage, DeadLetterSelection, ErrorKind, MessageId, NewMessage,
    OutboxAdmin, PublishOutcome,
};
use outbox_postgres_wal::{
    WalOutbox, WalRelay, WalRelayReport, NON_TRANSACTIONAL_DESTINATION, SLOT_LAG_BYTES,
    SLOT_LAG_SECONDS, UNDECODABLE_DESTINATION,
};
use outbox_testkit::{
    assert_recovered_from_faults, FaultyPublisher, PublishFault, RecordingPublisher, TestRecorder,
};
use tokio_util::sync::CancellationToken;

fn ids(messages: &[NewMessage]) -> Vec<MessageId> {
    messages.iter().map(NewMessage::id).collect()
}

wal_test! {
    /// Guarantee 1 and commit order: committed messages arrive, in commit order and
    /// slice order, with every field; rolled-back ones and other transactions never do.
    async fn publishes_committed_messages_in_commit_order((env, outbox) = Env::with_outbox(&[])) {
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
    async fn resumes_after_the_confirmed_position((env, outbox) = Env::with_outbox(&[])) {
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
    async fn a_crashed_relay_loses_nothing((env, outbox) = Env::with_outbox(&[])) {
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
    async fn permanent_refusals_become_dead_letters((env, outbox) = Env::with_outbox(&[])) {
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
    async fn retryable_failures_back_off_and_keep_order((env, outbox) = Env::with_outbox(&[])) {
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
    async fn gives_up_after_max_attempts((env, outbox) = Env::with_outbox(&[])) {
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
    async fn one_relay_per_slot((env, outbox) = Env::with_outbox(&[])) {
        let first = RecordingPublisher::new();
        let second = RecordingPublisher::new();
        let a = spawn(&env, &outbox, Arc::new(first.clone()), fast());
        commit(&outbox, &messages("d", 5, 1)).await;
        first.wait_for_unique(5, DEADLINE).await.unwrap();
        // The standby on its own pool, named, so it can be seen trying the lock.
        let standby_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(
                env.cluster
                    .url()
                    .parse::<sqlx::postgres::PgConnectOptions>()
                    .unwrap()
                    .application_name("wal-standby"),
            )
            .await
            .unwrap();
        let standby = WalOutbox::new(standby_pool.clone(), outbox.config().clone()).unwrap();
        let b = spawn(&env, &standby, Arc::new(second.clone()), fast());
        wait_until("the standby runs and has found the lock held", || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wal-standby' \
                 AND query LIKE '%pg_try_advisory_lock%'",
            )
            .fetch_one(&env.pool)
            .await
            .unwrap()
                > 0
        })
        .await;
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
    async fn undecodable_content_is_dead_lettered((env, outbox) = Env::with_outbox(&[])) {
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
    async fn an_invalidated_slot_stops_the_relay(
        (env, outbox) = Env::with_outbox(&[("max_slot_wal_keep_size", "1MB")])
    ) {
        commit(&outbox, &messages("d", 1, 1)).await;
        invalidate_slot(&env, &outbox).await;
        let err = run_until_refused(&outbox, env.target()).await;
        assert!(err.message().contains("invalidated"), "{}", err.report());
        // And install refuses to paper over it.
        assert!(outbox
            .install()
            .await
            .unwrap_err()
            .message()
            .contains("invalidated"));
    }

    /// A slot invalidated while its relay streams (the relay fell behind: its publisher
    /// holds a batch, so nothing past it is confirmed) stops the relay with the same error
    /// once the stream breaks; nothing committed after the lost log is ever published.
    async fn a_slot_invalidated_while_streaming_stops_the_relay(
        (env, outbox) = Env::with_outbox(&[("max_slot_wal_keep_size", "1MB")])
    ) {
        let (publisher, gate) = RecordingPublisher::new().hold_destination("held");
        let publisher = Arc::new(publisher);
        let relay = WalRelay::new(outbox.clone(), env.target(), publisher.clone(), fast()).unwrap();
        let task = tokio::spawn(relay.run(CancellationToken::new()));
        commit(&outbox, &messages("held", 1, 1)).await;
        publisher
            .wait_for_calls(1, DEADLINE)
            .await
            .expect("the relay hands the batch over");
        invalidate_slot(&env, &outbox).await;
        let after = messages("after", 1, 1);
        commit(&outbox, &after).await;
        gate.open();
        let err = tokio::time::timeout(DEADLINE, task)
            .await
            .expect("the relay stops by itself")
            .expect("relay task")
            .unwrap_err();
        assert!(!err.is_retryable());
        assert!(err.message().contains("invalidated"), "{}", err.report());
        assert_eq!(publisher.times_seen(after[0].id()), 0, "skipped ahead");
    }

    /// The lag gauges follow the stream: while the publisher holds a batch the retained
    /// log and the oldest message's age grow; once it is published both fall back. The
    /// counters agree with the relay's report.
    async fn lag_gauges_and_counters_follow_the_stream((env, outbox) = Env::with_outbox(&[])) {
        let (publisher, gate) = RecordingPublisher::new().hold_destination("held");
        let publisher = Arc::new(publisher);
        let recorder = TestRecorder::default();
        // A relay registers its handles when it is made.
        let relay = metrics::with_local_recorder(&recorder, || {
            WalRelay::new(outbox.clone(), env.target(), publisher.clone(), fast()).unwrap()
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(relay.run(stop.clone()));
        let slot = format!("slot={}", outbox.config().slot());
        let (bytes, age) = (
            || recorder.gauge(SLOT_LAG_BYTES, &slot).unwrap_or(0.0),
            || recorder.gauge(SLOT_LAG_SECONDS, &slot).unwrap_or(0.0),
        );
        commit(&outbox, &messages("held", 1, 1)).await;
        commit(&outbox, &messages("after", 3, 1)).await;
        publisher.wait_for_calls(1, DEADLINE).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE filler (x text); \
             INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)",
        )
        .execute(&env.pool)
        .await
        .unwrap();
        wait_until("the lag gauges show the held batch", || async {
            bytes() > 1_000_000.0 && age() > 0.0
        })
        .await;
        gate.open();
        wait_until("the lag gauges fall back once it is published", || async {
            publisher.unique_count() == 4 && bytes() < 500_000.0 && age() == 0.0
        })
        .await;
        stop.cancel();
        let report = tokio::time::timeout(DEADLINE, task)
            .await
            .expect("the relay stops")
            .unwrap()
            .unwrap();
        // What both relays do is counted under the polling relay's names, `relay` = slot.
        let relay = format!("relay={}", outbox.config().slot());
        assert_eq!(recorder.counter(DISPATCHED, &relay), report.published);
        assert!(report.published >= 4);
        assert_eq!(recorder.counter(DEAD_LETTERED, &relay), 0);
    }
}

wal_test! {
    flavor = current_thread;

    /// Install refuses a server without `wal_level = logical`: a private cluster with
    /// `wal_level = replica`.
    async fn install_needs_logical_wal_level(
        env = Env::start_with_only(&[("wal_level", "replica")])
    ) {
        let outbox = WalOutbox::new(
            env.pool.clone(),
            outbox_postgres_wal::WalOutboxConfig::default(),
        )
        .unwrap();
        let err = outbox.install().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.message().contains("wal_level"));
    }
}

wal_test! {
    /// Per-key order under a partial batch failure: a batch holds one message per key, so
    /// a broker refusing a key's first message (to retry) cannot accept its second one
    /// before it.
    async fn a_partial_batch_failure_keeps_per_key_order((env, outbox) = Env::with_outbox(&[])) {
        let all = messages("d", 6, 2);
        let first_of_k0 = all[0].id();
        // Only the first hand-over of the first message of key k0 fails.
        let publisher = Scripted::new(move |m, n| {
            if m.id == first_of_k0 && n == 1 {
                PublishOutcome::Retryable("broker busy".into())
            } else {
                PublishOutcome::Published
            }
        });
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        commit(&outbox, &all).await;
        wait_until("every message accepted", || async {
            publisher.accepted_all(&ids(&all))
        })
        .await;
        relay.shutdown().await;
        let log = publisher.log();
        for batch in &log.batches {
            let mut keys: Vec<_> = batch
                .iter()
                .filter_map(|m| m.partition_key.clone())
                .collect();
            let count = keys.len();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), count, "a batch repeats a key");
        }
        for key in ["k0", "k1"] {
            let mut firsts = Vec::new();
            for m in log
                .accepted
                .iter()
                .filter(|m| m.partition_key.as_deref() == Some(key))
            {
                if !firsts.contains(&m.id) {
                    firsts.push(m.id);
                }
            }
            let expected: Vec<MessageId> = all
                .iter()
                .filter(|m| m.partition_key() == Some(key))
                .map(NewMessage::id)
                .collect();
            assert_eq!(
                firsts, expected,
                "first acceptances of {key} in commit order"
            );
        }
    }

    /// Content that decodes but breaks the message rules (a NUL in the destination, a
    /// payload over the outbox's limit) is dead-lettered as undecodable, never published;
    /// the stream goes on.
    async fn content_breaking_the_rules_is_dead_lettered((env, outbox) = Env::with_outbox(&[])) {
        let strict = WalOutbox::new(
            env.pool.clone(),
            outbox
                .config()
                .clone()
                .with_limits(outbox_core::MessageLimits::default().with_max_payload_bytes(8)),
        )
        .unwrap();
        let publisher = RecordingPublisher::new();
        let relay = spawn(&env, &strict, Arc::new(publisher.clone()), fast());
        let nul = MessageId::new();
        let oversize = MessageId::new();
        emit(&strict, true, &raw_content(nul, "a\0b", b"x")).await;
        emit(&strict, true, &raw_content(oversize, "d", &[7; 9])).await;
        let good = messages("d", 1, 1);
        commit(&strict, &good).await;
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        let report = relay.shutdown().await;
        assert_eq!(publisher.times_seen(nul), 0);
        assert_eq!(publisher.times_seen(oversize), 0);
        assert_eq!(report.dead_lettered, 2);
        let letters = dead_letters(&strict).await;
        assert_eq!(letters.len(), 2);
        for letter in &letters {
            assert_eq!(letter.message.destination, UNDECODABLE_DESTINATION);
            assert!(
                letter
                    .message
                    .last_error
                    .as_deref()
                    .unwrap()
                    .contains("message rules"),
                "{:?}",
                letter.message.last_error
            );
        }
    }

    /// A non-transactional message under the prefix is decoded even when its transaction
    /// rolled back: it is dead-lettered, never published.
    async fn non_transactional_messages_are_never_published((env, outbox) = Env::with_outbox(&[])) {
        let publisher = RecordingPublisher::new();
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        let committed = MessageId::new();
        emit(&outbox, false, &raw_content(committed, "d", b"x")).await;
        let rolled_back = MessageId::new();
        let mut tx = outbox.pool().begin().await.unwrap();
        sqlx::query("SELECT pg_logical_emit_message(false, $1, $2)")
            .bind(outbox.config().prefix())
            .bind(raw_content(rolled_back, "d", b"y"))
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        let good = messages("d", 1, 1);
        commit(&outbox, &good).await;
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        relay.shutdown().await;
        assert_eq!(publisher.times_seen(committed), 0);
        assert_eq!(publisher.times_seen(rolled_back), 0);
        assert_eq!(publisher.published_count(), 1);
        let letters = dead_letters(&outbox).await;
        assert_eq!(letters.len(), 2);
        assert!(letters
            .iter()
            .all(|l| l.message.destination == NON_TRANSACTIONAL_DESTINATION));
    }

    /// An undecodable record read again after a resume is the same dead letter (its id
    /// comes from the slot and its position), not one more per replay.
    async fn undecodable_records_are_dead_lettered_once_across_replays(
        (env, outbox) = Env::with_outbox(&[])
    ) {
        // Two retryable failures of the good message: its transaction (and the junk before
        // it) is read three times.
        let publisher = RecordingPublisher::failing_first(2);
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        let good = messages("d", 1, 1);
        let mut tx = outbox.pool().begin().await.unwrap();
        sqlx::query("SELECT pg_logical_emit_message(true, $1, 'junk'::bytea)")
            .bind(outbox.config().prefix())
            .execute(&mut *tx)
            .await
            .unwrap();
        outbox.enqueue(&mut tx, &good).await.unwrap();
        tx.commit().await.unwrap();
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        let report = relay.shutdown().await;
        assert!(report.sessions >= 3, "replayed: {report:?}");
        assert_eq!(publisher.times_seen(good[0].id()), 3);
        let letters = dead_letters(&outbox).await;
        assert_eq!(letters.len(), 1, "one dead letter for one record");
        assert_eq!(letters[0].message.payload, b"junk");
    }

    /// Only retryable failures count as attempts: a message accepted in a batch whose
    /// other message failed is handed over again (after the resume) with its count
    /// unchanged.
    async fn only_retryable_failures_count_as_attempts((env, outbox) = Env::with_outbox(&[])) {
        let batch = messages("d", 2, 2);
        let failing = batch[0].id();
        let publisher = Scripted::new(move |m, n| {
            if m.id == failing && n <= 3 {
                PublishOutcome::Retryable("busy".into())
            } else {
                PublishOutcome::Published
            }
        });
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        commit(&outbox, &batch).await;
        wait_until("both accepted", || async {
            publisher.accepted_all(&ids(&batch))
        })
        .await;
        relay.shutdown().await;
        let log = publisher.log();
        assert_eq!(
            log.seen[&batch[1].id()],
            4,
            "handed over with the failing one"
        );
        for m in log.accepted.iter().filter(|m| m.id == batch[1].id()) {
            assert_eq!(m.attempts, 1, "never failed, so never counted");
        }
        let failed: Vec<u32> = log
            .batches
            .iter()
            .flatten()
            .filter(|m| m.id == failing)
            .map(|m| m.attempts)
            .collect();
        assert_eq!(failed, vec![1, 2, 3, 4]);
    }

    /// The rest of a burst after a full batch is published at once, not when the next
    /// replication event (on a quiet database, a keepalive) arrives.
    async fn the_tail_of_a_burst_is_published_at_once((env, outbox) = Env::with_outbox(&[])) {
        let publisher = RecordingPublisher::new();
        // No position saves or lag checks during the test: they are statements of the
        // relay's own that could make the server send an event.
        let quiet = fast()
            .with_batch_size(2)
            .with_status_interval(Duration::from_secs(60))
            .with_lag_interval(Duration::from_secs(60));
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), quiet);
        // Let the session start and go quiet first.
        commit(&outbox, &messages("warm", 1, 1)).await;
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        let burst: Vec<NewMessage> = (0..5)
            .map(|i| NewMessage::builder("d").payload(vec![i]).build().unwrap())
            .collect();
        commit(&outbox, &burst).await;
        // Far below the server's keepalive period (wal_sender_timeout / 2 = 30 s).
        publisher
            .wait_for_unique(6, Duration::from_secs(5))
            .await
            .expect("the whole burst within 5 s");
        // (A graceful stop would wait for the 60 s status interval's confirmation.)
        relay.task.abort();
        let _ = relay.task.await;
    }

    /// Shutdown interrupts a publish that does not return, after the shutdown grace; the
    /// batch stays unconfirmed and the next relay publishes it.
    async fn shutdown_interrupts_a_hung_publish((env, outbox) = Env::with_outbox(&[])) {
        let (hung, _gate) = RecordingPublisher::new().hold_destination("d");
        let relay = spawn(
            &env,
            &outbox,
            Arc::new(hung.clone()),
            fast().with_shutdown_grace(Duration::from_millis(200)),
        );
        let batch = messages("d", 1, 1);
        commit(&outbox, &batch).await;
        hung.wait_for_calls(1, DEADLINE).await.unwrap();
        let report = tokio::time::timeout(Duration::from_secs(10), relay.shutdown())
            .await
            .expect("shutdown does not wait for the hung publish");
        assert_eq!(report.published, 0);
        let next = RecordingPublisher::new();
        let relay = spawn(&env, &outbox, Arc::new(next.clone()), fast());
        next.wait_for_unique(1, DEADLINE).await.unwrap();
        relay.shutdown().await;
        assert_eq!(next.times_seen(batch[0].id()), 1);
    }

    /// A server restart ends the stream and the lock's session: the relay takes the lock
    /// again before streaming on, so a second relay cannot stream the slot beside it.
    async fn a_server_restart_takes_the_lock_again((env, outbox) = Env::with_outbox(&[])) {
        let publisher = RecordingPublisher::new();
        // A reconnect wait longer than the restart: the relay's next attempt finds the
        // server up, so only the end of the stream tells it the lock's session is gone.
        // No lag checks either: a failed one during the restart would also make it take
        // the lock again.
        let patient = fast()
            .with_initial_reconnect_backoff(Duration::from_secs(5))
            .with_max_reconnect_backoff(Duration::from_secs(5))
            .with_lag_interval(Duration::from_secs(600));
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), patient);
        commit(&outbox, &messages("d", 1, 1)).await;
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        env.cluster.restart().await;
        let after = messages("d", 1, 1);
        wait_until(
            "a message committed after the restart is published",
            || async {
                let Ok(mut tx) = outbox.pool().begin().await else {
                    return false;
                };
                if outbox.enqueue(&mut tx, &after).await.is_err() || tx.commit().await.is_err() {
                    return false;
                }
                publisher.times_seen(after[0].id()) > 0
            },
        )
        .await;
        let held = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
            )
            .fetch_one(&env.pool)
            .await
            .unwrap_or(0)
                == 1
        };
        wait_until("the streaming relay holds the slot lock again", held).await;
        relay.shutdown().await;
    }

    /// The saved position: a relay resumes from it when it is ahead of the slot's own (a
    /// server that lost the slot's unsaved position), and refuses one from another server
    /// or ahead of the log; install resets it when it creates the slot.
    async fn the_saved_position_is_used_and_checked((env, outbox) = Env::with_outbox(&[])) {
        let table = format!(
            "\"{}\".{}",
            outbox.config().dead_letters().schema(),
            outbox_postgres_wal::POSITIONS_TABLE
        );
        let slot = outbox.config().slot().to_owned();
        // Install created the slot: the row starts at the slot's creation, on this server.
        let (created, system_ok): (bool, bool) = sqlx::query_as(&format!(
            "SELECT p.slot_created_lsn = r.confirmed_flush_lsn AND p.confirmed_lsn = p.slot_created_lsn, \
             p.system_identifier = (SELECT system_identifier::text FROM pg_control_system()) \
             FROM {table} p JOIN pg_replication_slots r ON r.slot_name = p.slot WHERE p.slot = $1"
        ))
        .bind(&slot)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        assert!(created && system_ok);

        // Ahead of the slot (as if the server had lost the slot's confirmed position):
        // the relay starts at the saved one.
        let skipped = messages("d", 2, 1);
        commit(&outbox, &skipped).await;
        let set = |lsn_sql: &'static str| {
            let table = table.clone();
            let slot = slot.clone();
            let pool = env.pool.clone();
            async move {
                sqlx::query(&format!(
                    "UPDATE {table} SET confirmed_lsn = {lsn_sql} WHERE slot = $1"
                ))
                .bind(slot)
                .execute(&pool)
                .await
                .unwrap();
            }
        };
        set("pg_current_wal_lsn()").await;
        let later = messages("d", 1, 1);
        commit(&outbox, &later).await;
        let publisher = RecordingPublisher::new();
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        relay.shutdown().await;
        assert_eq!(publisher.times_seen(later[0].id()), 1);
        assert!(skipped.iter().all(|m| publisher.times_seen(m.id()) == 0));

        // Ahead of the log (a restored server): refused, loudly.
        set("pg_current_wal_lsn() + 100000000").await;
        let err = run_until_refused(&outbox, env.target()).await;
        assert!(err.message().contains("ahead of"), "{}", err.report());

        // Saved on another server: refused.
        set("pg_current_wal_lsn()").await;
        sqlx::query(&format!(
            "UPDATE {table} SET system_identifier = '1' WHERE slot = $1"
        ))
        .bind(&slot)
        .execute(&env.pool)
        .await
        .unwrap();
        let err = run_until_refused(&outbox, env.target()).await;
        assert!(err.message().contains("another server"), "{}", err.report());

        // A slot dropped and installed again starts over: the stale row is reset.
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&slot)
            .execute(&env.pool)
            .await
            .unwrap();
        outbox.install().await.unwrap();
        let fresh = messages("d", 1, 1);
        commit(&outbox, &fresh).await;
        let publisher = RecordingPublisher::new();
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        relay.shutdown().await;
        assert_eq!(publisher.times_seen(fresh[0].id()), 1);
    }

    /// A replication URL naming another database than the slot's is a configuration error
    /// at once, not a retry loop.
    async fn a_replication_url_for_another_database_is_refused(
        (env, outbox) = Env::with_outbox(&[])
    ) {
        let mut url = url::Url::parse(&env.cluster.url()).unwrap();
        url.set_path("/template1");
        let target = outbox_postgres_wal::ReplicationTarget::from_url(url.as_str()).unwrap();
        let err = run_until_refused(&outbox, target).await;
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.message().contains("template1"), "{}", err.report());
    }

    /// Transactions without outbox messages (table writes, other prefixes) are confirmed
    /// too: a relay with nothing to publish keeps the slot's lag down.
    async fn confirms_past_transactions_without_outbox_messages(
        (env, outbox) = Env::with_outbox(&[])
    ) {
        let publisher = RecordingPublisher::new();
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), fast());
        sqlx::raw_sql(
            "CREATE TABLE busy (x text); \
             INSERT INTO busy SELECT repeat('x', 100) FROM generate_series(1, 5000); \
             SELECT pg_logical_emit_message(true, 'someone_else', 'x');",
        )
        .execute(&env.pool)
        .await
        .unwrap();
        wait_until(
            "the slot's confirmed position passes the writes",
            || async {
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
        relay.shutdown().await;
        assert_eq!(publisher.calls(), 0);
    }
}

/// The publish-fault cases the polling relay runs too (`outbox-testkit`'s
/// `relay_faults`): one committed transaction of two messages whose first two publish
/// calls fail with `fault`; the relay resumes and publishes both. Returns the report.
async fn first_calls_fail(fault: PublishFault) -> Option<WalRelayReport> {
    let (env, outbox) = Env::with_outbox(&[]).await?;
    let publisher = FaultyPublisher::new(RecordingPublisher::new());
    publisher.inject(fault, 2);
    let recorder = TestRecorder::default();
    let config = fast().with_publish_timeout(Duration::from_millis(300));
    let relay = metrics::with_local_recorder(&recorder, || {
        spawn(&env, &outbox, Arc::new(publisher.clone()), config)
    });
    commit(&outbox, &messages("faulty", 2, 2)).await;
    publisher
        .recording()
        .wait_for_unique(2, DEADLINE)
        .await
        .unwrap();
    let report = relay.shutdown().await;
    assert_recovered_from_faults(&publisher, &recorder, outbox.config().slot(), 2);
    assert_eq!((report.published, report.retried), (2, 4));
    assert!(report.sessions > 1, "the failed call resumed a new session");
    Some(report)
}

wal_test! {
    async fn a_hung_publish_times_out_and_its_messages_are_retried(
        report = first_calls_fail(PublishFault::Hang)
    ) {
        assert_eq!(report.panics, 0);
    }

    async fn a_panicking_publish_is_caught_counted_and_its_messages_retried(
        report = first_calls_fail(PublishFault::Panic)
    ) {
        assert_eq!(report.panics, 2);
    }

    async fn outcomes_of_the_wrong_count_are_refused(
        report = first_calls_fail(PublishFault::WrongCount)
    ) {
        assert_eq!(report.panics, 0);
    }
}

/// One message to `destination` keyed `key`.
fn keyed(destination: &str, key: &str) -> NewMessage {
    NewMessage::builder(destination)
        .partition_key(key)
        .build()
        .unwrap()
}

wal_test! {
    /// Calls overlap: while the broker holds the first call, the next ones are published
    /// (what pipelining is for), and a key's later message still waits for its earlier one.
    async fn publish_calls_overlap_and_keep_per_key_order((env, outbox) = Env::with_outbox(&[])) {
        let (publisher, gate) = RecordingPublisher::new().hold_destination("held");
        let config = fast().with_batch_size(1).with_publish_concurrency(3);
        let relay = spawn(&env, &outbox, Arc::new(publisher.clone()), config);
        let first = vec![keyed("held", "a"), keyed("free", "b"), keyed("free", "c")];
        let later = vec![keyed("after", "a")];
        commit(&outbox, &first).await;
        commit(&outbox, &later).await;
        // `b` and `c` are published while the call carrying `a` is held.
        publisher.wait_for_unique(2, DEADLINE).await.unwrap();
        let early: Vec<MessageId> = publisher.published().iter().map(|m| m.id).collect();
        assert_eq!(early, vec![first[1].id(), first[2].id()]);
        gate.open();
        publisher.wait_for_unique(4, DEADLINE).await.unwrap();
        let report = relay.shutdown().await;
        assert_eq!(report.published, 4);
        let order = publisher.first_publish_order_by_key();
        assert_eq!(order["a"], vec![first[0].id(), later[0].id()]);
    }
}
