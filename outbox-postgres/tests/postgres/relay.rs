//! A relay whose database sessions are killed mid-drain recovers and delivers all.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{OutboxAdmin, OutboxStore, Relay, RelayConfig, RetryPolicy};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::RecordingPublisher;

use crate::common::{self, DEADLINE};
use crate::msg;

const MESSAGES: usize = 400;

/// Terminate every session of the relay's pool; returns how many.
async fn kill_sessions(admin: &sqlx::PgPool, application_name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1",
    )
    .bind(application_name)
    .fetch_one(admin)
    .await
    .unwrap()
}

pg_test! {
    async fn relay_recovers_from_killed_connections_mid_drain(
        url = common::service_url("relay with killed connections")
    ) {
        let admin = common::pool(&url, 2).await;
        let application_name = format!("obx-kill-{}", uuid::Uuid::new_v4().simple());
        let relay_pool = common::pool_named(&url, 4, &application_name).await;
        let config = PgOutboxConfig::default().with_schema(common::schema_name());
        let outbox = PgOutbox::new(relay_pool, config).unwrap();
        outbox.install().await.unwrap();
        // Enqueue through the admin pool so kills only hit the relay's sessions.
        let writer = PgOutbox::new(admin.clone(), outbox.config().clone()).unwrap();
        let batch: Vec<_> = (0..MESSAGES).map(msg).collect();
        crate::enqueue(&writer, &batch).await;

        let publisher = RecordingPublisher::new().with_delay(Duration::from_millis(10));
        let config = RelayConfig::default()
            .with_batch_size(10)
            .with_publish_batch_size(5)
            .with_publish_concurrency(2)
            .with_lease(Duration::from_secs(2))
            // The lease must cover a publish: set the timeout rather than the 10 s default.
            .with_publish_timeout(Duration::from_millis(500))
            .with_poll_interval(Duration::from_millis(10))
            .with_max_poll_interval(Duration::from_millis(200))
            .with_retry(
                RetryPolicy::new(20)
                    .with_initial_delay(Duration::from_millis(10))
                    .with_max_delay(Duration::from_millis(100)),
            );
        let store: Arc<dyn OutboxStore> = Arc::new(outbox.clone());
        let relay = Relay::new(store, Arc::new(publisher.clone()), config).unwrap();
        let running = relay.spawn();

        for progress in [MESSAGES / 8, MESSAGES / 2] {
            publisher.wait_for_unique(progress, DEADLINE).await.unwrap();
            let killed = kill_sessions(&admin, &application_name).await;
            assert!(
                killed > 0,
                "the relay's sessions should exist at {progress}"
            );
        }
        publisher.wait_for_unique(MESSAGES, DEADLINE).await.unwrap();
        common::wait_until("every message to be completed", || {
            let writer = writer.clone();
            async move {
                let s = writer.stats().await.unwrap();
                (s.pending, s.in_flight, s.dead) == (0, 0, 0)
            }
        })
        .await;
        let report = running.shutdown().await.unwrap();
        assert_eq!(publisher.unique_count(), MESSAGES);
        assert_eq!(report.dead_lettered, 0);
    }
}
