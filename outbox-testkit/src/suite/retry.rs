//! Retries, backoff and dead letters. Guarantee 5.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Disposition, Failure, OutboxStoreExt, RetryPolicy};

use super::*;
use crate::harness::Harness;
use crate::publishers::RecordingPublisher;

/// `fail` with a retry records the error and hides the message until the delay passes.
pub async fn fail_schedules_the_retry(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(2)).await.unwrap();
    let got = claim(&*store, 2, LONG_LEASE).await;
    let fail = |i: usize, after: Duration| Failure {
        lease: got[i].lease,
        error: format!("boom {i}"),
        disposition: Disposition::Retry { after },
    };
    store
        .fail_one(fail(0, Duration::from_secs(3600)))
        .await
        .unwrap();
    store
        .fail_one(fail(1, Duration::from_millis(200)))
        .await
        .unwrap();
    let s = stats(&*store).await;
    assert_eq!(
        (s.pending, s.in_flight),
        (2, 0),
        "scheduled retries count as pending"
    );

    let again = claim_eventually(&*store, 10, LONG_LEASE).await;
    assert_eq!(again.len(), 1, "only the short backoff came due");
    assert_eq!(again[0].message.id, got[1].message.id);
    assert_eq!(again[0].message.attempts, 2);
    assert_eq!(again[0].message.last_error.as_deref(), Some("boom 1"));
    assert!(
        claim(&*store, 10, LONG_LEASE).await.is_empty(),
        "the hour-long backoff holds"
    );
}

/// After the last attempt the relay dead-letters the message with its last error.
pub async fn last_attempt_dead_letters(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let publisher = RecordingPublisher::failing_destination("conformance");
    let config = fast_relay_config().retry(
        RetryPolicy::with_max_attempts(3)
            .backoff(Duration::from_millis(5), Duration::from_millis(20)),
    );
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config).spawn();
    wait_until("the message to be dead-lettered", || async {
        stats(&*store).await.dead == 1
    })
    .await;
    let report = relay.shutdown().await.unwrap();
    assert_eq!(
        (report.retried, report.dead_lettered, report.dispatched),
        (2, 1, 0)
    );

    let dead = store.dead_letters(None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 3);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("broker down"),
        "{dead:?}"
    );
    assert_eq!(publisher.times_seen(dead[0].id), 3);
    let s = stats(&*store).await;
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 1));
}

/// A permanent publish failure dead-letters at once.
pub async fn permanent_failure_dead_letters_at_once(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(2)).await.unwrap();
    let publisher = RecordingPublisher::rejecting();
    let relay = relay(
        Arc::clone(&store),
        Arc::new(publisher.clone()),
        fast_relay_config(),
    )
    .spawn();
    wait_until("both messages dead-lettered", || async {
        stats(&*store).await.dead == 2
    })
    .await;
    relay.shutdown().await.unwrap();
    let dead = store.dead_letters(None, 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    for m in dead {
        assert_eq!(m.attempts, 1);
        assert_eq!(publisher.times_seen(m.id), 1);
    }
}

/// Requeued dead letters are delivered; listing pages by id.
pub async fn requeued_dead_letters_are_delivered(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(3)).await.unwrap();
    for c in claim(&*store, 3, LONG_LEASE).await {
        let failure = Failure {
            lease: c.lease,
            error: "poison".into(),
            disposition: Disposition::DeadLetter,
        };
        store.fail_one(failure).await.unwrap();
    }
    let first_page = store.dead_letters(None, 2).await.unwrap();
    let second_page = store.dead_letters(Some(first_page[1].id), 2).await.unwrap();
    assert_eq!((first_page.len(), second_page.len()), (2, 1));
    assert!(first_page[0].id < first_page[1].id && first_page[1].id < second_page[0].id);
    assert!(
        claim(&*store, 10, LONG_LEASE).await.is_empty(),
        "dead letters are not claimable"
    );

    let ids: Vec<_> = first_page
        .iter()
        .chain(&second_page)
        .map(|m| m.id)
        .collect();
    assert_eq!(store.requeue_dead(&ids[..2]).await.unwrap(), 2);
    assert_eq!(
        store.requeue_dead(&ids[..2]).await.unwrap(),
        0,
        "already requeued"
    );

    let publisher = RecordingPublisher::new();
    let relay = relay(
        Arc::clone(&store),
        Arc::new(publisher.clone()),
        fast_relay_config(),
    )
    .spawn();
    publisher.wait_for_unique(2, DEADLINE).await.unwrap();
    relay.relay().wait_idle(DEADLINE).await.unwrap();
    relay.shutdown().await.unwrap();
    let s = stats(&*store).await;
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 1));
    for m in publisher.published() {
        assert_eq!(m.attempts, 1, "requeue resets the attempt count");
        assert_eq!(m.last_error.as_deref(), Some("poison"));
    }
}
