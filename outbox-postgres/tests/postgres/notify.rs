//! NOTIFY is off unless asked for; when on it is sent on commit only, and the listener
//! wakes relays and survives its connection being killed.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ErrorKind, NewMessage, Relay, RelayConfig};
use outbox_postgres::{spawn_listener, Notify, PgOutboxConfig};
use outbox_testkit::RecordingPublisher;
use sqlx::postgres::PgListener;

use crate::common::{self, DEADLINE};
use crate::{msg, pg_outbox};

async fn next_payload(listener: &mut PgListener) -> String {
    let n = tokio::time::timeout(DEADLINE, listener.recv())
        .await
        .expect("a notification within the deadline")
        .unwrap();
    n.payload().to_owned()
}

pg_test! {
    async fn notify_is_sent_on_commit_only_and_once_per_transaction(
        (pool, outbox) = pg_outbox(
            "notify on commit",
            3,
            PgOutboxConfig::default().with_notify(Notify::OnCommit),
        )
    ) {
        let channel = outbox.config().notify_channel().unwrap();
        let mut listener = PgListener::connect_with(&pool).await.unwrap();
        listener.listen(&channel).await.unwrap();
        let sentinel = |text: &'static str| {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel.clone())
                .bind(text)
        };

        let mut tx = pool.begin().await.unwrap();
        outbox.enqueue(&mut tx, &[msg(0)]).await.unwrap();
        tx.rollback().await.unwrap();
        sentinel("after rollback").execute(&pool).await.unwrap();
        // Notifications arrive in commit order: one from the rollback would come first.
        assert_eq!(next_payload(&mut listener).await, "after rollback");

        let mut tx = pool.begin().await.unwrap();
        outbox.enqueue(&mut tx, &[msg(1)]).await.unwrap();
        outbox.enqueue(&mut tx, &[msg(2), msg(3)]).await.unwrap();
        tx.commit().await.unwrap();
        sentinel("after commit").execute(&pool).await.unwrap();
        assert_eq!(
            next_payload(&mut listener).await,
            "",
            "the enqueue's notification"
        );
        assert_eq!(
            next_payload(&mut listener).await,
            "after commit",
            "identical notifications in one transaction fold into one"
        );

        // An enqueue that writes nothing (its id is stored) notifies nothing.
        let again = NewMessage::builder("d")
            .id(msg_id(&pool, &outbox).await)
            .build()
            .unwrap();
        let mut tx = pool.begin().await.unwrap();
        let err = outbox.enqueue(&mut tx, &[again]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        tx.commit().await.unwrap();
        sentinel("after conflict").execute(&pool).await.unwrap();
        assert_eq!(next_payload(&mut listener).await, "after conflict");
    }
}

/// Any stored message id.
async fn msg_id(pool: &sqlx::PgPool, outbox: &outbox_postgres::PgOutbox) -> outbox_core::MessageId {
    let id: uuid::Uuid = sqlx::query_scalar(&format!(
        "SELECT id FROM {} LIMIT 1",
        outbox.qualified_name()
    ))
    .fetch_one(pool)
    .await
    .unwrap();
    outbox_core::MessageId::from_uuid(id)
}

pg_test! {
    /// By default enqueueing notifies nothing: a commit must not take PostgreSQL's
    /// cluster-wide notify lock unless the application asked for NOTIFY.
    async fn enqueue_sends_no_notify_by_default(
        (pool, outbox) = pg_outbox("notify off by default", 3, PgOutboxConfig::default())
    ) {
        assert_eq!(outbox.config().notify(), &Notify::Off);
        // The channel NOTIFY would use if it were turned on.
        let channel = outbox
            .config()
            .clone()
            .with_notify(Notify::OnCommit)
            .notify_channel()
            .unwrap();
        let mut listener = PgListener::connect_with(&pool).await.unwrap();
        listener.listen(&channel).await.unwrap();

        crate::enqueue(&outbox, &[msg(0)]).await;
        sqlx::query("SELECT pg_notify($1, 'sentinel')")
            .bind(&channel)
            .execute(&pool)
            .await
            .unwrap();
        // Notifications arrive in commit order: one from the enqueue would come first.
        assert_eq!(next_payload(&mut listener).await, "sentinel");
    }
}

/// The backend pid of the session listening on `channel`, once there is one.
async fn listener_pid(pool: &sqlx::PgPool, channel: &str, not: Option<i32>) -> i32 {
    let query = format!("LISTEN \"{channel}\"");
    common::poll_for("the listener's session", || {
        let (pool, query) = (pool.clone(), query.clone());
        async move {
            sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity WHERE query = $1 AND pid <> $2",
            )
            .bind(&query)
            .bind(not.unwrap_or(0))
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    })
    .await
}

pg_test! {
    async fn listener_wakes_an_idle_relay_and_recovers_from_a_killed_connection(
        (pool, outbox) = pg_outbox(
            "listener",
            6,
            PgOutboxConfig::default().with_notify(Notify::OnCommit),
        )
    ) {
        let publisher = RecordingPublisher::new();
        // Polls so rare that only wake-ups can explain a prompt delivery.
        let hour = Duration::from_secs(3600);
        let config = RelayConfig::default()
            .with_poll_interval(hour)
            .with_max_poll_interval(hour);
        let relay = Relay::new(
            Arc::new(outbox.clone()),
            Arc::new(publisher.clone()),
            config,
        )
        .unwrap();
        let channel = outbox.config().notify_channel().unwrap();
        let listener = spawn_listener(pool.clone(), channel.clone(), relay.wakeup()).unwrap();
        let running = relay.spawn();
        common::wait_until("the listener to connect", || {
            let connected = listener.connections() >= 1;
            async move { connected }
        })
        .await;
        let pid = listener_pid(&pool, &channel, None).await;

        crate::enqueue(&outbox, &[msg(0)]).await;
        publisher.wait_for_unique(1, DEADLINE).await.unwrap();
        // The claim the connect's wake-up started may deliver the message before the
        // listener has counted its notification: wait for the count, don't race it.
        common::wait_until("the first notification", || {
            let received = listener.notifications() >= 1;
            async move { received }
        })
        .await;

        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(killed);
        common::wait_until("the listener to reconnect", || {
            let reconnected = listener.connections() >= 2;
            async move { reconnected }
        })
        .await;
        listener_pid(&pool, &channel, Some(pid)).await;

        let before = listener.notifications();
        crate::enqueue(&outbox, &[msg(1)]).await;
        publisher.wait_for_unique(2, DEADLINE).await.unwrap();
        common::wait_until("the notification after reconnecting", || {
            let received = listener.notifications() > before;
            async move { received }
        })
        .await;

        running.shutdown().await.unwrap();
        listener.stop().await;
    }

    /// A listener given a shutdown signal stops when the signal fires, like a relay given
    /// `with_shutdown`; its handle's `stop` still works afterwards.
    async fn listener_stops_on_its_shutdown_signal(
        pool = common::connect("listener shutdown signal", 2)
    ) {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let listener = spawn_listener(
            pool.clone(),
            "obx_shutdown_test",
            outbox_core::Wakeup::new(),
        )
        .unwrap()
        .with_shutdown(shutdown.clone().cancelled_owned());
        common::wait_until("the listener to connect", || {
            let connected = listener.connections() >= 1;
            async move { connected }
        })
        .await;
        assert!(!listener.is_finished());
        shutdown.cancel();
        common::wait_until("the listener to stop on the signal", || {
            let finished = listener.is_finished();
            async move { finished }
        })
        .await;
        listener.stop().await;
    }
}
