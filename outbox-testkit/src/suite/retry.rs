//! Retries, backoff and dead letters. Guarantee 5.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{store::Disposition, store::OutboxStoreExt, DeadLetterSelection, RetryPolicy};

use super::*;
use crate::doubles::publishers::RecordingPublisher;
use crate::harness::Harness;

/// `fail` with a retry records the error and hides the message until the delay passes.
pub async fn fail_schedules_the_retry(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(2)).await.unwrap();
    let got = claim(&*store, 2, LONG_LEASE).await;
    let fail = |i: usize, after: Duration| {
        failure(
            got[i].lease,
            format!("boom {i}"),
            Disposition::Retry { after },
        )
    };
    store
        .fail_one(fail(0, Duration::from_secs(3600)))
        .await
        .unwrap();
    store
        .fail_one(fail(1, Duration::from_millis(200)))
        .await
        .unwrap();
    let s = stats(&*f.admin()).await;
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
    let config = fast_relay_config().with_retry(
        RetryPolicy::new(3)
            .with_initial_delay(Duration::from_millis(5))
            .with_max_delay(Duration::from_millis(20)),
    );
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config).spawn();
    wait_until("the message to be dead-lettered", || async {
        stats(&*f.admin()).await.dead == 1
    })
    .await;
    let report = relay.shutdown().await.unwrap();
    assert_eq!(
        (report.retried, report.dead_lettered, report.dispatched),
        (2, 1, 0)
    );

    let dead = dead_letters(&*f.admin()).await;
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
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 1));
}

/// A message whose earlier attempts ended with no outcome recorded (the relay died, or
/// its lease lapsed, mid-publish) is dead-lettered once its claim is past the policy's
/// last attempt, without being published again: a message whose publish kills the
/// relay cannot loop for ever.
pub async fn attempts_without_outcome_dead_letter(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    // Two attempts that end with no settle: the leases lapse, as when a relay dies.
    for attempt in 1..=2 {
        let got = claim_eventually(&*store, 1, SHORT_LEASE).await;
        assert_eq!(got[0].message.attempts, attempt);
    }
    let publisher = RecordingPublisher::new();
    let config = fast_relay_config().with_retry(RetryPolicy::new(2));
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config).spawn();
    wait_until("the message to be dead-lettered", || async {
        stats(&*f.admin()).await.dead == 1
    })
    .await;
    let report = relay.shutdown().await.unwrap();
    assert_eq!((report.dead_lettered, report.dispatched), (1, 0));
    assert_eq!(publisher.published_count(), 0, "not published again");
    let dead = dead_letters(&*f.admin()).await;
    assert_eq!(dead[0].attempts, 3);
    let error = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("without an outcome"), "{error}");
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
        stats(&*f.admin()).await.dead == 2
    })
    .await;
    relay.shutdown().await.unwrap();
    let dead = dead_letters(&*f.admin()).await;
    assert_eq!(dead.len(), 2);
    for m in dead {
        assert_eq!(m.attempts, 1);
        assert_eq!(publisher.times_seen(m.id), 1);
    }
}

/// Dead letters are listed in id order, page by page, and by filter (destination, age).
pub async fn dead_letters_are_listed_and_filtered(h: &dyn Harness) {
    let f = plain(h).await;
    let (store, admin) = (f.store(), f.admin());
    f.enqueue(vec![msg("a", 0), msg("a", 1), msg("b", 2), msg("c", 3)])
        .await
        .unwrap();
    for c in claim(&*store, 4, LONG_LEASE).await {
        store
            .fail_one(failure(c.lease, "poison", Disposition::DeadLetter))
            .await
            .unwrap();
    }
    let all = DeadLetterFilter::default();
    let first = DeadLetterPage::new(all.clone(), 3).unwrap();
    let first_page = admin.dead_letters(&first).await.unwrap();
    let after = first_page.last().unwrap().message.id;
    let second_page = admin.dead_letters(&first.after(after)).await.unwrap();
    assert_eq!((first_page.len(), second_page.len()), (3, 1));
    let ids: Vec<MessageId> = first_page
        .iter()
        .chain(&second_page)
        .map(|d| d.message.id)
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "id order across pages");
    for d in first_page.iter().chain(&second_page) {
        assert_eq!(d.message.last_error.as_deref(), Some("poison"));
        let age = std::time::SystemTime::now()
            .duration_since(d.dead_at)
            .unwrap_or_default();
        assert!(
            age < Duration::from_secs(600),
            "dead_at is the storage's now: {age:?}"
        );
    }

    let only_a = DeadLetterPage::new(all.clone().with_destination("a").unwrap(), 10).unwrap();
    let a: Vec<String> = admin
        .dead_letters(&only_a)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.message.destination)
        .collect();
    assert_eq!(a, ["a", "a"]);
    let old =
        DeadLetterPage::new(all.clone().with_dead_for(Duration::from_secs(3600)), 10).unwrap();
    assert!(
        admin.dead_letters(&old).await.unwrap().is_empty(),
        "nothing died an hour ago"
    );
    wait_until("the dead letters to age a little", || {
        let admin = Arc::clone(&admin);
        let young = all.clone().with_dead_for(Duration::from_millis(50));
        async move {
            let page = DeadLetterPage::new(young, 10).unwrap();
            admin.dead_letters(&page).await.unwrap().len() == 4
        }
    })
    .await;
}

/// Requeue and discard by id or by filter touch dead letters only, and count what they
/// changed.
pub async fn dead_letters_are_requeued_and_discarded_by_filter(h: &dyn Harness) {
    let f = plain(h).await;
    let (store, admin) = (f.store(), f.admin());
    let batch = vec![
        msg("a", 0),
        msg("a", 1),
        msg("b", 2),
        msg("b", 3),
        msg("live", 4),
    ];
    let live = batch[4].id();
    f.enqueue(batch).await.unwrap();
    for c in claim_each(&*store, 5, LONG_LEASE).await {
        if c.message.id != live {
            let dead = failure(c.lease, "poison", Disposition::DeadLetter);
            store.fail_one(dead).await.unwrap();
        }
    }
    let b = DeadLetterFilter::default().with_destination("b").unwrap();
    let discard_b = DeadLetterSelection::Matching {
        filter: b.clone(),
        limit: 1,
    };
    assert_eq!(
        admin.discard_dead(&discard_b).await.unwrap(),
        1,
        "bounded by its limit"
    );
    assert_eq!(admin.discard_dead(&discard_b).await.unwrap(), 1);
    assert_eq!(
        admin.discard_dead(&discard_b).await.unwrap(),
        0,
        "no b left"
    );
    let s = stats(&*admin).await;
    assert_eq!(
        (s.dead, s.in_flight),
        (2, 1),
        "discard touches dead letters only"
    );

    let untouched = DeadLetterSelection::Ids(vec![live, MessageId::new()]);
    assert_eq!(
        admin.requeue_dead(&untouched).await.unwrap(),
        0,
        "not dead letters"
    );
    assert_eq!(
        admin.discard_dead(&untouched).await.unwrap(),
        0,
        "not dead letters"
    );
    let a = DeadLetterFilter::default().with_destination("a").unwrap();
    let requeue_a = DeadLetterSelection::Matching {
        filter: a,
        limit: 10,
    };
    assert_eq!(admin.requeue_dead(&requeue_a).await.unwrap(), 2);
    let s = stats(&*admin).await;
    assert_eq!((s.pending, s.dead, s.in_flight), (2, 0, 1));
    let again = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(again.len(), 2);
    assert!(again
        .iter()
        .all(|c| c.message.destination == "a" && c.message.attempts == 1));
}

/// Requeued dead letters are delivered with their attempt count reset.
pub async fn requeued_dead_letters_are_delivered(h: &dyn Harness) {
    let f = plain(h).await;
    let (store, admin) = (f.store(), f.admin());
    f.enqueue(msgs(3)).await.unwrap();
    for c in claim(&*store, 3, LONG_LEASE).await {
        let failure = failure(c.lease, "poison", Disposition::DeadLetter);
        store.fail_one(failure).await.unwrap();
    }
    assert!(
        claim(&*store, 10, LONG_LEASE).await.is_empty(),
        "dead letters are not claimable"
    );
    let ids: Vec<MessageId> = dead_letters(&*admin).await.iter().map(|m| m.id).collect();
    let two = DeadLetterSelection::Ids(vec![ids[0], ids[1], ids[0]]);
    assert_eq!(admin.requeue_dead(&two).await.unwrap(), 2);
    assert_eq!(
        admin.requeue_dead(&two).await.unwrap(),
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
    let s = stats(&*admin).await;
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 1));
    for m in publisher.published() {
        assert_eq!(m.attempts, 1, "requeue resets the attempt count");
        assert_eq!(m.last_error.as_deref(), Some("poison"));
    }
}
