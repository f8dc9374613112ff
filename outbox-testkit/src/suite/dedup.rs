//! [`DedupStore`] cases: atomic recording, read-your-writes, consumer scoping, expiry,
//! bounded purges and the dedup [`Purger`].

use crate::harness::declared::SEALED;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::names::MAX_NAME_LEN;
use outbox_core::{
    Consistency, ConsumerName, Dedup, DedupStore, ErrorKind, LockName, MessageId, PurgeRun, Purger,
};
use tokio::sync::Barrier;

use crate::harness::dedup::DedupHarness;
use crate::macros::groups::require;
use crate::wait::wait_until;

/// A retention no case outlives.
const LONG: Duration = Duration::from_secs(3600);
/// A retention short enough to await: records expire while the case waits.
const EXPIRY: Duration = Duration::from_millis(300);
/// A short retention that still leaves fresh records fresh while a case purges.
const PURGE_RETENTION: Duration = Duration::from_secs(1);
/// Slack added when waiting for a retention to pass, for clocks read at different
/// moments by the test and the store.
const SLACK: Duration = Duration::from_millis(50);
/// How many tasks race to record one id.
const RACERS: usize = 32;

async fn store(h: &dyn DedupHarness, retention: Duration) -> Arc<dyn DedupStore> {
    h.store(retention)
        .await
        .expect("harness could not make a dedup store")
}

fn consumer(name: &str) -> ConsumerName {
    ConsumerName::new(name).expect("valid consumer name")
}

async fn record(store: &dyn DedupStore, consumer: &ConsumerName, id: MessageId) -> Dedup {
    store
        .record(consumer, id)
        .await
        .unwrap_or_else(|e| panic!("record({consumer:?}, {id}) failed: {}", e.report()))
}

/// Record an id never recorded before, which must be [`Dedup::New`].
async fn record_new(store: &dyn DedupStore, consumer: &ConsumerName, id: MessageId) {
    assert_eq!(
        record(store, consumer, id).await,
        Dedup::New,
        "the first record of an id for {consumer:?} must be New"
    );
}

async fn contains(store: &dyn DedupStore, consumer: &ConsumerName, id: MessageId) -> bool {
    store
        .contains(consumer, id)
        .await
        .unwrap_or_else(|e| panic!("contains({consumer:?}, {id}) failed: {}", e.report()))
}

async fn purge(store: &dyn DedupStore, limit: usize) -> u64 {
    store
        .purge_expired(limit)
        .await
        .unwrap_or_else(|e| panic!("purge_expired({limit}) failed: {}", e.report()))
}

/// Wait (polling the clock) until `retention` has passed since `since`.
async fn outlive(retention: Duration, since: Instant) {
    let what = format!("the {retention:?} retention to pass");
    wait_until(&what, || async move { since.elapsed() > retention + SLACK }).await;
}

/// Of many concurrent `record`s of one `(consumer, id)`, exactly one returns
/// [`Dedup::New`].
pub async fn dedup_concurrent_records_give_exactly_one_new(h: &dyn DedupHarness) {
    let store = store(h, LONG).await;
    let consumer = consumer("racing consumer");
    for round in 0..3 {
        let id = MessageId::new();
        let start = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = (0..RACERS)
            .map(|_| {
                let (store, consumer, start) = (store.clone(), consumer.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    store.record(&consumer, id).await
                })
            })
            .collect();
        let mut new = 0;
        for task in tasks {
            match task.await.expect("a record task panicked") {
                Ok(Dedup::New) => new += 1,
                Ok(Dedup::Duplicate) => {}
                Err(e) => panic!("a concurrent record failed: {}", e.report()),
            }
        }
        assert_eq!(
            new, 1,
            "round {round}: {new} of {RACERS} concurrent records of one id returned \
             Dedup::New; exactly one must"
        );
        assert_eq!(
            record(&*store, &consumer, id).await,
            Dedup::Duplicate,
            "a record after the race must be a duplicate"
        );
    }
}

/// The store declares the consistency the harness expects
/// ([`DedupFeatures::strong`](crate::DedupFeatures::strong)).
pub async fn dedup_declared_consistency_matches_the_harness(h: &dyn DedupHarness) {
    let store = store(h, LONG).await;
    let expected = if h.features(SEALED).strong {
        Consistency::Strong
    } else {
        Consistency::Eventual
    };
    assert_eq!(
        store.consistency(),
        expected,
        "the store declares a consistency the harness does not (DedupFeatures::strong)"
    );
}

/// A [`Consistency::Strong`] store reports an id from the moment `record` returns.
pub async fn dedup_strong_store_reads_its_writes(h: &dyn DedupHarness) {
    require(h.features(SEALED).strong, "strong");
    let store = store(h, LONG).await;
    assert_eq!(store.consistency(), Consistency::Strong);
    let consumer = consumer("reader");
    for _ in 0..20 {
        let id = MessageId::new();
        assert!(
            !contains(&*store, &consumer, id).await,
            "contains reported an id never recorded"
        );
        record_new(&*store, &consumer, id).await;
        assert!(
            contains(&*store, &consumer, id).await,
            "contains was false right after record returned, but the store declares Strong"
        );
        assert_eq!(
            record(&*store, &consumer, id).await,
            Dedup::Duplicate,
            "a second record of an id must be a Duplicate"
        );
    }
}

/// The same id recorded for two consumers is two records; `contains` answers per
/// consumer.
pub async fn dedup_ids_are_scoped_by_consumer(h: &dyn DedupHarness) {
    let store = store(h, LONG).await;
    let (billing, shipping) = (consumer("billing"), consumer("shipping"));
    let id = MessageId::new();
    record_new(&*store, &billing, id).await;
    assert!(
        !contains(&*store, &shipping, id).await,
        "an id recorded for one consumer is reported for another"
    );
    assert_eq!(
        record(&*store, &shipping, id).await,
        Dedup::New,
        "the same id for a second consumer must be a new record"
    );
    for c in [&billing, &shipping] {
        assert_eq!(
            record(&*store, c, id).await,
            Dedup::Duplicate,
            "a second record of an id for {c:?} must be a Duplicate"
        );
    }
    if store.consistency() == Consistency::Strong {
        for c in [&billing, &shipping] {
            assert!(
                contains(&*store, c, id).await,
                "contains lost {c:?}'s record"
            );
        }
    }
}

/// An id older than the retention is not reported, before any purge: `contains` says
/// `false` and `record` says [`Dedup::New`] again (re-recording it).
pub async fn dedup_expired_ids_are_new_again_before_any_purge(h: &dyn DedupHarness) {
    require(h.features(SEALED).short_retention, "short_retention");
    let store = store(h, EXPIRY).await;
    let consumer = consumer("expiring");
    let (a, b) = (MessageId::new(), MessageId::new());
    record_new(&*store, &consumer, a).await;
    record_new(&*store, &consumer, b).await;
    outlive(EXPIRY, Instant::now()).await;

    assert!(
        !contains(&*store, &consumer, a).await,
        "contains still reports an id recorded more than the {EXPIRY:?} retention ago; \
         expired ids must read as absent even before a purge"
    );
    let again = Instant::now();
    assert_eq!(
        record(&*store, &consumer, b).await,
        Dedup::New,
        "record of an id past its {EXPIRY:?} retention must say New (and re-record it)"
    );
    let second = record(&*store, &consumer, b).await;
    assert!(
        second == Dedup::Duplicate || again.elapsed() >= EXPIRY,
        "a re-recorded expired id must count as recorded again"
    );
}

/// `purge_expired(limit)` deletes at most `limit` records, only expired ones, and
/// returns how many; `purge_expired(0)` deletes nothing.
pub async fn dedup_purge_is_bounded_and_spares_fresh_records(h: &dyn DedupHarness) {
    require(h.features(SEALED).short_retention, "short_retention");
    let store = store(h, PURGE_RETENTION).await;
    let (c, other) = (consumer("purged"), consumer("also purged"));
    for _ in 0..5 {
        record_new(&*store, &c, MessageId::new()).await;
    }
    record_new(&*store, &other, MessageId::new()).await;
    outlive(PURGE_RETENTION, Instant::now()).await;

    let fresh_at = Instant::now();
    let fresh: Vec<_> = (0..3).map(|_| MessageId::new()).collect();
    for id in &fresh {
        record_new(&*store, &c, *id).await;
    }
    assert_eq!(
        purge(&*store, 0).await,
        0,
        "purge_expired(0) must delete nothing"
    );
    assert_eq!(
        purge(&*store, 4).await,
        4,
        "with 6 expired records, purge_expired(4) must delete and report exactly 4"
    );
    assert_eq!(
        purge(&*store, 10).await,
        2,
        "purge_expired(10) must delete and report the 2 expired records left"
    );
    assert_eq!(purge(&*store, 10).await, 0, "nothing expired is left");
    assert!(
        fresh_at.elapsed() < PURGE_RETENTION,
        "inconclusive: the machine took over {PURGE_RETENTION:?} to purge, so the fresh \
         records expired too"
    );
    for id in &fresh {
        assert_eq!(
            record(&*store, &c, *id).await,
            Dedup::Duplicate,
            "a record younger than the retention is gone after purging: purge_expired \
             deleted it (or record never reports a Duplicate)"
        );
    }
}

/// [`Purger::for_dedup`] skips while its lock is held elsewhere, then purges every
/// expired record in bounded batches, sparing fresh ones, and releases its lock.
pub async fn dedup_purger_removes_expired_records_under_its_lock(h: &dyn DedupHarness) {
    require(h.features(SEALED).short_retention, "short_retention");
    let store = store(h, PURGE_RETENTION).await;
    let lock = h.purge_lock().await.expect("harness could not make a lock");
    let name = LockName::new(format!("conformance dedup purge {}", MessageId::new()))
        .expect("valid lock name");
    let purger = Purger::for_dedup(store.clone(), lock.clone(), 2)
        .expect("valid purger")
        .with_lock_name(name.clone());
    let c = consumer("purger");
    for _ in 0..5 {
        record_new(&*store, &c, MessageId::new()).await;
    }
    outlive(PURGE_RETENTION, Instant::now()).await;
    let fresh_at = Instant::now();
    let fresh = MessageId::new();
    record_new(&*store, &c, fresh).await;

    let held = lock
        .try_lock(&name)
        .await
        .expect("try_lock")
        .expect("free lock");
    let run = purger.run_once().await.expect("purge run");
    assert_eq!(
        run,
        PurgeRun::Skipped,
        "a purger ran while another held its lock"
    );
    held.unlock().await.expect("unlock");

    let run = purger.run_once().await.expect("purge run");
    assert_eq!(
        run,
        PurgeRun::Purged(5),
        "the purger must delete all 5 expired records"
    );
    assert!(
        fresh_at.elapsed() < PURGE_RETENTION,
        "inconclusive: the purge took over {PURGE_RETENTION:?}, so the fresh record expired"
    );
    assert_eq!(
        record(&*store, &c, fresh).await,
        Dedup::Duplicate,
        "a record younger than the retention is gone after the purger ran"
    );
    let again = lock.try_lock(&name).await.expect("try_lock");
    again
        .expect("the purger must release its lock")
        .unlock()
        .await
        .expect("unlock");
}

/// Consumer names follow the one rule of [`ConsumerName`] (so bad ones never reach a
/// store), and the store keeps every valid name as given: names differing only in case,
/// in surrounding spaces or in non-ASCII text are different consumers.
pub async fn dedup_consumer_names_follow_the_one_rule(h: &dyn DedupHarness) {
    let too_long = "n".repeat(MAX_NAME_LEN + 1);
    for bad in ["", "   ", "\t", "new\nline", "nul\0", &too_long] {
        let err = ConsumerName::new(bad).expect_err("a bad consumer name was accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
    }
    let store = store(h, LONG).await;
    let longest = "n".repeat(MAX_NAME_LEN);
    let longest_multibyte = format!("{}n", "é".repeat((MAX_NAME_LEN - 1) / 2));
    let names = [
        "billing",
        "Billing",
        "billing ",
        " billing",
        "quote ' \" ; -- \\ % _ *",
        "日本語の消費者",
        "crab 🦀",
        &longest,
        &longest_multibyte,
    ];
    let id = MessageId::new();
    for name in names {
        let c = consumer(name);
        assert_eq!(
            record(&*store, &c, id).await,
            Dedup::New,
            "consumer {name:?} shares records with another name"
        );
    }
    for name in names {
        assert_eq!(
            record(&*store, &consumer(name), id).await,
            Dedup::Duplicate,
            "the record of consumer {name:?} was lost"
        );
    }
}
