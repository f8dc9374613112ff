//! Claims: leases, concurrency, explicit ids. Guarantees 2 and 4.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{store::Disposition, store::OutboxStoreExt, MessageId, NewMessage};

use super::*;
use crate::harness::Harness;

/// Enqueued fields come back unchanged from a claim, and `attempts` counts the claim.
pub async fn enqueued_fields_round_trip(h: &dyn Harness) {
    let f = plain(h).await;
    let sent = NewMessage::builder("orders.created")
        .partition_key("order-7")
        .content_type("application/json")
        .header("traceparent", "00-abc-def-01")
        .header("tenant", "acme")
        .payload(b"{\"id\":7}\x00\xff".to_vec())
        .build()
        .unwrap();
    f.enqueue(vec![sent.clone()]).await.unwrap();
    let got = claim(&*f.store(), 10, LONG_LEASE).await;
    assert_eq!(got.len(), 1);
    let m = &got[0].message;
    assert_eq!(m.id, sent.id());
    assert_eq!(m.destination, "orders.created");
    assert_eq!(m.partition_key.as_deref(), Some("order-7"));
    assert_eq!(m.content_type.as_deref(), Some("application/json"));
    assert_eq!(&m.headers, sent.headers());
    assert_eq!(m.payload, sent.payload());
    assert_eq!(m.attempts, 1);
    assert_eq!(m.last_error, None);
    assert_eq!(got[0].lease.id, sent.id());
}

/// A delayed message is not claimable before its delay has passed, and is after.
pub async fn delayed_messages_wait(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let much_later = NewMessage::builder("d")
        .delay(Duration::from_secs(3600))
        .build()
        .unwrap();
    // A second: the claim below must start before it passes, on a loaded machine too
    // (200 ms did not always, against DynamoDB Local under the whole suite).
    let soon = NewMessage::builder("d")
        .delay(Duration::from_secs(1))
        .build()
        .unwrap();
    let soon_id = soon.id();
    // A first claim may do the store's own setup (DynamoDB takes its shard leases,
    // which took over a second on a loaded machine): done before the clock starts.
    assert!(claim(&*store, 1, LONG_LEASE).await.is_empty());
    f.enqueue(vec![much_later, soon, msg("d", 1)])
        .await
        .unwrap();
    let got = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(got.len(), 1, "only the undelayed message is due at once");
    assert_eq!(
        stats(&*f.admin()).await.pending,
        2,
        "delayed messages count as pending"
    );
    let got = claim_eventually(&*store, 10, LONG_LEASE).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, soon_id, "the short delay comes due");
    assert!(
        claim(&*store, 10, LONG_LEASE).await.is_empty(),
        "the hour-long delay holds"
    );
}

/// Claims take due messages oldest availability first, then in enqueue order.
pub async fn claims_follow_availability_then_enqueue_order(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let batch = msgs(5);
    let ids: Vec<MessageId> = batch.iter().map(|m| m.id()).collect();
    f.enqueue(batch).await.unwrap();
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(claim(&*store, 1, LONG_LEASE).await[0].message.id);
    }
    assert_eq!(order, ids);
}

/// Claims skip messages held by a live lease.
pub async fn claim_skips_live_leases(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(3)).await.unwrap();
    let first = claim(&*store, 2, LONG_LEASE).await;
    assert_eq!(first.len(), 2);
    let second = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(second.len(), 1, "the two leased messages must be skipped");
    let ids: HashSet<MessageId> = first.iter().chain(&second).map(|c| c.message.id).collect();
    assert_eq!(ids.len(), 3);
    assert!(claim(&*store, 10, LONG_LEASE).await.is_empty());
}

/// Eight concurrent claimers over 2,000 messages claim each exactly once.
pub async fn concurrent_claimers_claim_each_once(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let all = msgs(2000);
    let expected: HashSet<MessageId> = all.iter().map(|m| m.id()).collect();
    for chunk in all.chunks(500) {
        f.enqueue(chunk.to_vec()).await.unwrap();
    }
    // A held-lock store keeps a connection per open batch: its claimers complete each
    // batch (what a relay does), so overlapping claims still show as duplicates.
    let complete = held_lock(&*store);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            // Bounded: a store that hands out live leases again never runs dry, and
            // this claimer would loop for ever. Past every message once, it stops and
            // the duplicates fail the case below.
            while mine.len() <= 2000 {
                let got = claim(&*store, 25, LONG_LEASE).await;
                if got.is_empty() {
                    break;
                }
                if complete {
                    let leases: Vec<Lease> = got.iter().map(|c| c.lease).collect();
                    let done = store.complete(&leases).await.expect("complete failed");
                    assert!(done.lost.is_empty(), "a claimed lease was lost: {done:?}");
                }
                mine.extend(got.into_iter().map(|c| c.message.id));
            }
            mine
        }));
    }
    let claimed = tokio::time::timeout(CASE_DEADLINE, futures::future::join_all(tasks))
        .await
        .unwrap_or_else(|_| {
            panic!("8 claimers did not drain 2,000 messages within {CASE_DEADLINE:?}")
        });
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in claimed {
        for id in t.unwrap() {
            total += 1;
            assert!(
                seen.insert(id),
                "message {id} claimed twice while its lease was live"
            );
        }
    }
    assert_eq!(total, 2000);
    assert_eq!(seen, expected);
}

/// The longest a case that loops over claims may run before it fails.
const CASE_DEADLINE: Duration = Duration::from_secs(120);

/// The plain store calls work at all: each of enqueue, claim, complete, release and
/// stats returns without error, and the first one that fails names itself (a backend
/// whose statements the server refuses fails here with the cause, not as a hang or a
/// mismatch elsewhere).
pub async fn plain_store_calls_succeed(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let sent = msgs(2);
    f.enqueue(sent.clone())
        .await
        .unwrap_or_else(|e| panic!("enqueue failed: {}", e.report()));
    let request = outbox_core::store::ClaimRequest::new(2, LONG_LEASE).expect("a valid claim");
    let got = store
        .claim(request)
        .await
        .unwrap_or_else(|e| panic!("claim failed: {}", e.report()))
        .into_messages();
    assert_eq!(
        got.len(),
        2,
        "claim returned {} of 2 due messages",
        got.len()
    );
    let completed = store
        .complete(&[got[0].lease])
        .await
        .unwrap_or_else(|e| panic!("complete failed: {}", e.report()));
    assert_eq!(
        completed.applied, 1,
        "complete applied nothing: {completed:?}"
    );
    let released = store
        .release(&[got[1].lease])
        .await
        .unwrap_or_else(|e| panic!("release failed: {}", e.report()));
    assert_eq!(released.applied, 1, "release applied nothing: {released:?}");
    f.admin()
        .stats()
        .await
        .unwrap_or_else(|e| panic!("stats failed: {}", e.report()));
}

/// Releasing a claim gives its attempt back: the next claim of the message counts the
/// same attempt again, so a relay that shuts down never spends a message's attempts.
pub async fn release_gives_the_attempt_back(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let first = claim(&*store, 1, LONG_LEASE).await;
    assert_eq!(first[0].message.attempts, 1);
    let settled = store.release(&[first[0].lease]).await.unwrap();
    assert!(settled.lost.is_empty(), "{settled:?}");
    let again = claim(&*store, 1, LONG_LEASE).await;
    assert_eq!(again.len(), 1, "a released message is claimable at once");
    assert_eq!(
        again[0].message.attempts, 1,
        "release gives the attempt back: the re-claim is attempt 1 again"
    );
}

/// Once a lease lapses the message can be claimed again, with its attempt counted.
pub async fn expired_leases_are_reclaimable(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let first = claim(&*store, 1, SHORT_LEASE).await;
    assert_eq!(first.len(), 1);
    let again = claim_eventually(&*store, 1, LONG_LEASE).await;
    assert_eq!(again[0].message.id, first[0].message.id);
    assert_eq!(again[0].message.attempts, 2);
    assert_ne!(
        again[0].lease.token, first[0].lease.token,
        "a re-claim needs a fresh token"
    );
}

/// `claim_ids` takes the named due messages and skips ones leased elsewhere.
pub async fn claim_ids_skips_rows_leased_elsewhere(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let m = msgs(4);
    let ids: Vec<MessageId> = m.iter().map(|m| m.id()).collect();
    f.enqueue(m).await.unwrap();
    let got = claim_ids(&*store, &ids[..2], LONG_LEASE).await;
    assert_eq!(got.len(), 2);
    let unknown = MessageId::new();
    let got = claim_ids(&*store, &[ids[0], ids[1], ids[2], unknown], LONG_LEASE).await;
    let got: Vec<MessageId> = got.into_iter().map(|c| c.message.id).collect();
    assert_eq!(got, vec![ids[2]], "leased and unknown ids are skipped");
    let rest = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].message.id, ids[3]);
}

/// `claim_ids` skips messages that are delayed, dead or already dispatched.
pub async fn claim_ids_skips_undue_dead_and_dispatched(h: &dyn Harness) {
    let f = fixture(h, keeping()).await;
    let store = f.store();
    let delayed = NewMessage::builder("d")
        .delay(Duration::from_secs(3600))
        .build()
        .unwrap();
    let batch = vec![delayed, msg("d", 1), msg("d", 2)];
    let ids: Vec<MessageId> = batch.iter().map(|m| m.id()).collect();
    f.enqueue(batch).await.unwrap();
    let got = claim_ids(&*store, &ids[1..], LONG_LEASE).await;
    assert_eq!(got.len(), 2);
    let (done, dead) = if got[0].message.id == ids[1] {
        (&got[0], &got[1])
    } else {
        (&got[1], &got[0])
    };
    store.complete_one(&done.lease).await.unwrap();
    store
        .fail_one(failure(dead.lease, "dead", Disposition::DeadLetter))
        .await
        .unwrap();
    let again = claim_ids(&*store, &ids, LONG_LEASE).await;
    assert!(
        again.is_empty(),
        "delayed, dispatched and dead ids are all skipped: {again:?}"
    );
}
