//! The relay engine against the store: shutdown, crashes, scale, explicit dispatch.
//! Guarantees 4 and 7.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::MessageId;

use super::*;
use crate::doubles::publishers::RecordingPublisher;
use crate::harness::Harness;

/// Graceful shutdown gives back leases it will not finish: publishes that never started
/// are released without using up an attempt; a publish abandoned after the grace period
/// is failed for an immediate retry, keeping its attempt (the broker may have it).
pub async fn shutdown_releases_leases(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(6)).await.unwrap();
    // One publish call in flight at a time, and it never finishes within the grace.
    let publisher = RecordingPublisher::new().with_delay(Duration::from_secs(600));
    let config = fast_relay_config()
        .with_lease(Duration::from_secs(600))
        .with_publish_batch_size(3)
        .with_publish_concurrency(1)
        .with_shutdown_grace(Duration::from_millis(50));
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config).spawn();
    publisher.wait_for_calls(1, DEADLINE).await.unwrap();
    assert_eq!(stats(&*f.admin()).await.in_flight, 6);

    let report = relay.shutdown().await.unwrap();
    assert_eq!(
        (report.released, report.retried, report.dispatched),
        (3, 3, 0),
        "{report:?}"
    );
    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.pending, s.in_flight),
        (6, 0),
        "every lease is given back, due at once"
    );
    let mut abandoned = 0;
    for c in claim(&*store, 10, LONG_LEASE).await {
        if c.message.last_error.is_some() {
            abandoned += 1;
            assert_eq!(
                c.message.attempts, 2,
                "an abandoned publish keeps its attempt"
            );
        } else {
            assert_eq!(c.message.attempts, 1, "a release gives the attempt back");
        }
    }
    assert_eq!(abandoned, 3);
}

/// Shutdown lets a publish in flight finish within the grace period and releases the
/// part of the batch it had not started.
pub async fn shutdown_finishes_in_flight_and_releases_the_rest(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(6)).await.unwrap();
    let (publisher, gate) = RecordingPublisher::new().hold_destination("conformance");
    let config = fast_relay_config()
        .with_lease(Duration::from_secs(600))
        .with_publish_batch_size(3)
        .with_publish_concurrency(1)
        .with_shutdown_grace(DEADLINE);
    // The service's shutdown tree: cancelling it stops the relay.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config)
        .with_shutdown(shutdown.clone().cancelled_owned())
        .spawn();
    publisher.wait_for_calls(1, DEADLINE).await.unwrap();

    // Signal first, so the held call finishes during shutdown.
    shutdown.cancel();
    wait_until("the relay to see the shutdown signal", || async {
        relay.relay().is_stopping()
    })
    .await;
    gate.open();
    let report = relay.shutdown().await.unwrap();
    assert_eq!((report.dispatched, report.released), (3, 3), "{report:?}");
    assert_eq!(publisher.calls(), 1, "no publish may start after shutdown");
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight), (3, 0));
}

/// A relay task aborted mid-batch loses nothing: its leases lapse and another relay
/// delivers every message.
pub async fn killed_relay_loses_nothing(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let sent = msgs(40);
    let ids: HashSet<MessageId> = sent.iter().map(|m| m.id()).collect();
    // The store's first claim may do its own setup (DynamoDB takes its shard leases,
    // which took over a second on a loaded machine and let the doomed relay's held
    // calls time out before it was aborted): done before the relay starts.
    assert!(claim(&*store, 1, LONG_LEASE).await.is_empty());
    f.enqueue(sent).await.unwrap();

    let (stuck, _never_opened) = RecordingPublisher::new().hold_destination("conformance");
    // The doomed relay is aborted once its held calls started; they must not time out
    // (and fail their messages) before that, on a loaded machine too: 1.5 s of the
    // 2-second lease, the most a lease that also covers the claim allows.
    let config = fast_relay_config()
        .with_lease(Duration::from_secs(2))
        .with_publish_timeout(Duration::from_millis(1500))
        .with_batch_size(20)
        .with_publish_batch_size(10)
        .with_publish_concurrency(2);
    let doomed = relay(Arc::clone(&store), Arc::new(stuck.clone()), config.clone()).spawn();
    // Both publish calls of each batch it holds hang: one batch, or two when pipelining
    // lets it claim the second while the first hangs.
    let batches = config.pipeline_depth.min(2);
    stuck
        .wait_for_calls(2 * batches as u64, DEADLINE)
        .await
        .unwrap();
    doomed.abort().await;

    let publisher = RecordingPublisher::new();
    let survivor = relay(
        Arc::clone(&store),
        Arc::new(publisher.clone()),
        config.clone(),
    )
    .spawn();
    publisher.wait_for_unique(40, DEADLINE).await.unwrap();
    survivor.shutdown().await.unwrap();
    let delivered: HashSet<MessageId> = publisher.published().iter().map(|m| m.id).collect();
    assert_eq!(delivered, ids);
    let published = publisher.published();
    assert!(
        published.iter().all(|m| m.last_error.is_none()),
        "recovered by lease expiry, not by a failure path"
    );
    let held = 20 * batches;
    let reclaimed = published.iter().filter(|m| m.attempts == 2).count();
    if held_lock(&*store) {
        // A held-lock store charges a dead batch's attempt by a sweep before a claim; a
        // claim that races the batch's end takes its messages before they are charged
        // (the charge then waits for that claim to end, and a completed message is not
        // charged at all).
        assert!(
            reclaimed <= held,
            "at most the dead relay's batches were charged: {reclaimed} of {held}"
        );
    } else {
        assert_eq!(
            reclaimed, held,
            "the dead relay's batches were claimed again after their lease"
        );
    }
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 0));
}

/// Four relays over 10,000 messages deliver all of them exactly once when nothing fails.
pub async fn relays_deliver_all_without_duplicates(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let sent = msgs(10_000);
    for chunk in sent.chunks(1000) {
        f.enqueue(chunk.to_vec()).await.unwrap();
    }
    let publisher = RecordingPublisher::new();
    let relays: Vec<_> = (0..4)
        .map(|i| {
            let config = fast_relay_config()
                .with_name(format!("relay-{i}"))
                .with_batch_size(100)
                .with_publish_batch_size(50)
                .with_publish_concurrency(2);
            relay(Arc::clone(&store), Arc::new(publisher.clone()), config).spawn()
        })
        .collect();
    // A bound against a hang, not a speed check: on two shared cores DynamoDB Local
    // drains 10,000 messages through four relays in 90 to 150 s.
    publisher
        .wait_for_unique(10_000, DEADLINE * 10)
        .await
        .unwrap();
    let mut dispatched = 0;
    for r in relays {
        dispatched += r.shutdown().await.unwrap().dispatched;
    }
    assert_eq!(
        publisher.duplicates(),
        0,
        "no message may publish twice when nothing fails"
    );
    assert_eq!(publisher.published_count(), 10_000);
    assert_eq!(dispatched, 10_000);
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight), (0, 0));
}

/// Explicit dispatch right after commit runs alongside the background relay, with no
/// message published twice.
pub async fn explicit_dispatch_runs_alongside_sweeps(h: &dyn Harness) {
    let f: Arc<dyn crate::Fixture> = Arc::from(plain(h).await);
    let store = f.store();
    let publisher = RecordingPublisher::new();
    let relay = relay(
        Arc::clone(&store),
        Arc::new(publisher.clone()),
        fast_relay_config(),
    );
    let background = relay.spawn();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (f, relay) = (Arc::clone(&f), relay.clone());
        writers.push(tokio::spawn(async move {
            let mut explicit = 0;
            for round in 0..5 {
                let batch: Vec<_> = (0..10)
                    .map(|i| msg("explicit", w * 1000 + round * 10 + i))
                    .collect();
                let ids: Vec<MessageId> = batch.iter().map(|m| m.id()).collect();
                f.enqueue(batch).await.unwrap();
                explicit += relay.dispatch_ids(&ids).await.unwrap().dispatched;
            }
            explicit
        }));
    }
    let mut explicit = 0;
    for w in writers {
        explicit += w.await.unwrap();
    }
    publisher.wait_for_unique(400, DEADLINE).await.unwrap();
    background.relay().wait_idle(DEADLINE).await.unwrap();
    let report = background.shutdown().await.unwrap();
    assert_eq!(publisher.duplicates(), 0);
    assert_eq!(
        report.dispatched, 400,
        "explicit and background dispatches add up"
    );
    assert!(explicit > 0, "explicit dispatch published nothing");
}

/// An explicit dispatch stuck in a slow publish does not hold up the background relay:
/// there is no lock around dispatch.
pub async fn explicit_dispatch_does_not_block_the_sweeper(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let (publisher, gate) = RecordingPublisher::new().hold_destination("held");
    // The loop polls only when woken, so it cannot take the held message first.
    let config = fast_relay_config()
        .with_poll_interval(Duration::from_secs(3600))
        .with_max_poll_interval(Duration::from_secs(3600));
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config);
    let background = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();

    let held = msg("held", 0);
    let held_id = held.id();
    f.enqueue(vec![held]).await.unwrap();
    let explicit = {
        let relay = relay.clone();
        tokio::spawn(async move { relay.dispatch_ids(&[held_id]).await })
    };
    publisher.wait_for_calls(1, DEADLINE).await.unwrap();

    f.enqueue(msgs(5)).await.unwrap();
    relay.wakeup().wake();
    publisher.wait_for_unique(5, DEADLINE).await.unwrap();
    assert!(
        !explicit.is_finished(),
        "the explicit dispatch is still held"
    );

    gate.open();
    let report = explicit.await.unwrap().unwrap();
    assert_eq!(report.dispatched, 1);
    background.shutdown().await.unwrap();
    assert_eq!(publisher.duplicates(), 0);
}
