//! Losing the connection against a real RabbitMQ (`OUTBOX_AMQP_URL`): the broker
//! closing it, a partition (through a private TCP proxy, so no other test is
//! disturbed), and a cancelled publish. The publisher must report the messages caught
//! up in it as retryable within its timeouts, and the next publish must reconnect.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{all_published, message_id, messages, Broker};
use outbox_core::{PublishOutcome, Publisher};
use outbox_rabbitmq::{RabbitPublisher, Routing};
use outbox_testkit::wait::{poll_for, wait_until};

/// Run `rabbitmqctl`, or `None` when it cannot be run here (a remote broker).
async fn rabbitmqctl(args: &[&str]) -> Option<String> {
    let output = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .ok()?;
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The broker-side pid of the connection named `name`.
async fn connection_pid(name: &str) -> Option<String> {
    let listing = rabbitmqctl(&["list_connections", "-s", "pid", "client_properties"]).await?;
    listing
        .lines()
        .find(|line| line.contains(name))
        .and_then(|line| line.split_whitespace().next())
        .map(str::to_owned)
}

rabbit_test! {
    async fn a_connection_the_broker_closed_is_reopened_by_the_next_publish(
        url = common::service_url()
    ) {
        if rabbitmqctl(&["-q", "status"]).await.is_none() {
            assert!(
                !outbox_testkit::integration_required(),
                "rabbitmqctl is needed to close a connection from the broker's side"
            );
            eprintln!("SKIPPED: rabbitmqctl is not available to close a connection");
            return;
        }
        let mut broker = Broker::connect(&url).await;
        let queue = common::unique("closed");
        broker.queue_named(&queue, false).await;
        let config = broker.config();
        let name = config.connection_name().to_owned();
        let publisher = RabbitPublisher::new(config).unwrap();

        let before = messages(&queue, 5);
        assert!(all_published(&publisher.publish(&before).await.unwrap()));
        let pid = poll_for("the publisher's connection listed", || {
            let name = name.clone();
            async move { connection_pid(&name).await }
        })
        .await;
        rabbitmqctl(&[
            "close_connection",
            &pid,
            "closed by an outbox-rabbitmq test",
        ])
        .await;
        wait_until("the publisher to see its connection closed", || async {
            !publisher.is_connected()
        })
        .await;

        let after = messages(&queue, 5);
        let outcomes = publisher.publish(&after).await.unwrap();
        assert!(all_published(&outcomes), "{outcomes:?}");
        assert!(publisher.is_connected());
        let reopened = connection_pid(&name).await.expect("a new connection");
        assert_ne!(reopened, pid);

        let got = broker.take(&queue, 10).await;
        let expected: Vec<_> = before.iter().chain(&after).map(|m| m.id).collect();
        assert_eq!(got.iter().map(message_id).collect::<Vec<_>>(), expected);
        broker.teardown().await;
    }

    async fn publishes_during_an_outage_are_retryable_in_bounded_time_and_publishing_resumes(
        (url, mut broker) = common::broker()
    ) {
        let exchange = broker.topic_exchange().await;
        let queue = broker.bound_queue(&exchange, "routed.#", false).await;
        let proxy = Proxy::start(common::address(&url)).await;
        let config =
            outbox_rabbitmq::RabbitPublisherConfig::new(common::via_port(&url, proxy.port))
                .with_connection_name(common::unique("partitioned"))
                .with_routing(Routing::exchange(&exchange))
                .with_connect_timeout(Duration::from_secs(1))
                .with_publish_timeout(Duration::from_secs(2));
        let bound = common::bound(&config);
        let publisher = Arc::new(RabbitPublisher::new(config).unwrap());

        let before = messages("routed.before", 10);
        assert!(all_published(&publisher.publish(&before).await.unwrap()));

        proxy.cut();
        // The first call may still find the old connection (lapin has not seen the cut
        // yet) or may reconnect; the rest reconnect into the partition. Several at once
        // share a reconnect attempt: none waits for the others' attempts in turn.
        for round in 0..2 {
            let started = Instant::now();
            let calls: Vec<_> = (0..4)
                .map(|i| {
                    let publisher = publisher.clone();
                    let batch = messages(&format!("routed.outage{round}{i}"), 5);
                    tokio::spawn(async move { publisher.publish(&batch).await.unwrap() })
                })
                .collect();
            for call in calls {
                let outcomes = call.await.unwrap();
                assert_eq!(outcomes.len(), 5);
                assert!(
                    outcomes
                        .iter()
                        .all(|o| matches!(o, PublishOutcome::Retryable(_))),
                    "{outcomes:?}"
                );
            }
            assert!(
                started.elapsed() < bound,
                "round {round} took {:?}, over {bound:?}",
                started.elapsed()
            );
        }
        assert!(
            proxy.swallowed() >= 1,
            "a reconnect was attempted during the outage"
        );
        assert!(!publisher.is_connected());

        proxy.restore();
        let after = messages("routed.after", 10);
        let outcomes = publisher.publish(&after).await.unwrap();
        assert!(all_published(&outcomes), "{outcomes:?}");

        let got = broker.take(&queue, 20).await;
        let expected: Vec<_> = before.iter().chain(&after).map(|m| m.id).collect();
        assert_eq!(got.iter().map(message_id).collect::<Vec<_>>(), expected);
        broker.teardown().await;
    }

    /// A partition that closes nothing (no FIN, no RST): lapin would notice only when
    /// heartbeats stop. The publisher gives up at its publish timeout and drops the silent
    /// connection, so the next publish reconnects instead of waiting on it again.
    async fn a_silent_partition_is_bounded_by_the_timeouts_and_the_connection_is_replaced(
        (url, mut broker) = common::broker()
    ) {
        let queue = common::unique("silent");
        broker.queue_named(&queue, false).await;
        let proxy = Proxy::start(common::address(&url)).await;
        let config =
            outbox_rabbitmq::RabbitPublisherConfig::new(common::via_port(&url, proxy.port))
                .with_connection_name(common::unique("silent"))
                .with_connect_timeout(Duration::from_secs(1))
                .with_publish_timeout(Duration::from_secs(1));
        let bound = common::bound(&config);
        let publisher = RabbitPublisher::new(config).unwrap();

        let before = messages(&queue, 3);
        assert!(all_published(&publisher.publish(&before).await.unwrap()));

        proxy.freeze();
        for attempt in 0..2 {
            let started = Instant::now();
            let outcomes = publisher.publish(&messages(&queue, 3)).await.unwrap();
            assert!(
                outcomes
                    .iter()
                    .all(|o| matches!(o, PublishOutcome::Retryable(_))),
                "attempt {attempt}: {outcomes:?}"
            );
            assert!(
                started.elapsed() < bound,
                "attempt {attempt} took {:?}",
                started.elapsed()
            );
            assert!(
                !publisher.is_connected(),
                "attempt {attempt}: the silent connection is dropped"
            );
        }
        assert!(proxy.swallowed() >= 1, "the second attempt reconnected");

        proxy.restore();
        let after = messages(&queue, 3);
        let outcomes = publisher.publish(&after).await.unwrap();
        assert!(all_published(&outcomes), "{outcomes:?}");
        // The frozen publish never reached the broker: only these arrive.
        let got = broker.take(&queue, 6).await;
        let expected: Vec<_> = before.iter().chain(&after).map(|m| m.id).collect();
        assert_eq!(got.iter().map(message_id).collect::<Vec<_>>(), expected);
        broker.teardown().await;
    }

    async fn a_cancelled_publish_leaves_nothing_that_blocks_the_next(
        (_, mut broker) = common::broker()
    ) {
        let queue = common::unique("cancelled");
        broker.queue_named(&queue, true).await;
        let publisher = RabbitPublisher::new(broker.config().with_max_in_flight(5)).unwrap();

        let batch = messages(&queue, 1_000);
        let cancelled = tokio::select! {
            _ = publisher.publish(&batch) => false,
            () = wait_until("the first message in the queue", || async {
                broker.depth(&queue).await > 0
            }) => true,
        };
        if !cancelled {
            eprintln!("note: the batch finished before the test could cancel it");
        }

        let outcomes = publisher.publish(&batch).await.unwrap();
        assert!(all_published(&outcomes), "{outcomes:?}");
        // At least once: the cancelled call may have delivered some of them already.
        let depth = poll_for("every message of the batch in the queue", || async {
            let depth = broker.depth(&queue).await as usize;
            (depth >= batch.len()).then_some(depth)
        })
        .await;
        let got = broker.take(&queue, depth).await;
        let ids: HashSet<_> = got.iter().map(message_id).collect();
        assert!(batch.iter().all(|m| ids.contains(&m.id)));
        broker.teardown().await;
    }
}
