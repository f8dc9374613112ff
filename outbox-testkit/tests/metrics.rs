//! What the relay and the stats reporter record through the `metrics` facade: the
//! counters agree with the relay's own report, gauges follow the store, and every
//! metric has help text.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::monitor::{self, describe_metrics, StatsReporter};
use outbox_core::relay::metrics as names;
use outbox_core::{
    store::Disposition, store::Failure, store::OutboxStoreExt, ErrorStatus, NewMessage,
    OutboxStore, Relay, RelayConfig, RetryPolicy,
};
use outbox_testkit::{Fault, FaultyStore, MemoryStore, Op, RecordingPublisher, TestRecorder};

fn gauge(recorder: &TestRecorder, name: &str, labels: &str) -> f64 {
    recorder.gauge(name, labels).expect("gauge set")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn relay_counters_match_its_report() {
    let recorder = TestRecorder::default();
    let rt = runtime();
    let memory = MemoryStore::new();
    let msgs: Vec<_> = (0..5)
        .map(|_| NewMessage::builder("t").build().unwrap())
        .collect();
    memory.enqueue(&msgs).unwrap();
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Claim, Fault::Error(ErrorStatus::Temporary), 1);
    store.inject(Op::Claim, Fault::Panic, 1);
    let config = RelayConfig::default()
        .with_name("metered")
        .with_batch_size(2)
        .with_poll_interval(Duration::from_millis(5))
        .with_max_poll_interval(Duration::from_millis(20))
        .with_retry(
            RetryPolicy::new(3)
                .with_initial_delay(Duration::from_secs(60))
                .with_max_delay(Duration::from_secs(60)),
        );
    // Handles are taken when the relay is made: the recorder must be installed then.
    let relay = metrics::with_local_recorder(&recorder, || {
        let store: Arc<dyn OutboxStore> = Arc::new(store.clone());
        Relay::new(
            store,
            Arc::new(RecordingPublisher::failing_first(1)),
            config,
        )
        .unwrap()
    });
    let report = rt.block_on(async {
        let handle = relay.spawn();
        outbox_testkit::wait_until("every message to be tried", || async {
            relay.report().retried == 5
        })
        .await;
        handle.shutdown().await.unwrap()
    });
    let label = "relay=metered";
    assert_eq!(
        (report.retried, report.store_errors, report.panics),
        (5, 1, 1)
    );
    assert_eq!(recorder.counter(names::RETRIED, label), report.retried);
    assert_eq!(
        recorder.counter(names::DISPATCHED, label),
        report.dispatched
    );
    assert_eq!(recorder.counter(names::STORE_ERRORS, label), 1);
    assert_eq!(recorder.counter(names::PANICS, label), 1);
    assert_eq!(recorder.counter(names::DEAD_LETTERED, label), 0);
}

#[test]
fn the_reporter_sets_the_stats_as_gauges() {
    let recorder = TestRecorder::default();
    let rt = runtime();
    let memory = MemoryStore::new();
    let msgs: Vec<_> = (0..4)
        .map(|_| NewMessage::builder("t").build().unwrap())
        .collect();
    memory.enqueue(&msgs).unwrap();
    let stats = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let claimed = memory
                .claim(outbox_core::store::ClaimRequest::new(2, Duration::from_secs(60)).unwrap())
                .await
                .unwrap();
            let dead = Failure::new(claimed[0].lease, "x", Disposition::DeadLetter);
            memory.fail_one(dead).await.unwrap();
            StatsReporter::new(Arc::new(memory.clone()), "orders")
                .report_once()
                .await
                .unwrap()
        })
    });
    let label = "outbox=orders";
    assert_eq!((stats.pending, stats.in_flight, stats.dead), (2, 1, 1));
    assert!((gauge(&recorder, monitor::PENDING, label) - 2.0).abs() < f64::EPSILON);
    assert!((gauge(&recorder, monitor::IN_FLIGHT, label) - 1.0).abs() < f64::EPSILON);
    assert!((gauge(&recorder, monitor::DEAD, label) - 1.0).abs() < f64::EPSILON);
    assert!(gauge(&recorder, monitor::DISPATCHED_KEPT, label).abs() < f64::EPSILON);
    let age = gauge(&recorder, monitor::OLDEST_PENDING_AGE, label);
    assert!((0.0..60.0).contains(&age), "{age}");
}

#[test]
fn the_spawned_reporter_stops_on_shutdown() {
    let rt = runtime();
    rt.block_on(async {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = StatsReporter::new(Arc::new(MemoryStore::new()), "idle")
            .with_interval(Duration::from_millis(5))
            .spawn(shutdown.clone().cancelled_owned());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the reporter stops on shutdown")
            .unwrap();
    });
}

#[test]
fn every_metric_is_described() {
    let recorder = TestRecorder::default();
    metrics::with_local_recorder(&recorder, describe_metrics);
    for name in [
        names::DISPATCHED,
        names::RETRIED,
        names::DEAD_LETTERED,
        names::LEASES_LOST,
        names::RELEASED,
        names::STORE_ERRORS,
        names::PANICS,
        names::CLAIM_SECONDS,
        names::COMMIT_TO_PUBLISH_SECONDS,
        monitor::PENDING,
        monitor::IN_FLIGHT,
        monitor::DEAD,
        monitor::DISPATCHED_KEPT,
        monitor::OLDEST_PENDING_AGE,
        monitor::STATS_ERRORS,
    ] {
        assert!(recorder.is_described(name), "{name} has no description");
    }
}
