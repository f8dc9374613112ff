//! Held-lock claims (`ClaimMode::HeldLock`) beyond the conformance suite, which runs
//! whole in that mode: a claim writes nothing to its rows, a batch whose relay dies is
//! charged its attempt, a message that kills relay after relay is dead-lettered at the
//! last attempt, and operator calls never wait on held rows.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::OutboxStoreExt, ClaimMode, DeadLetterSelection, ErrorKind,
    MessageId, OutboxAdmin, OutboxStore, Relay, RelayConfig, RetryPolicy,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::{within, RecordingPublisher};
use sqlx::PgPool;

use crate::{common, enqueue, msg, pg_outbox, table};

const LONG: Duration = Duration::from_secs(300);

/// Held-lock settings in `schema` (`crate::outbox` replaces an empty one with a fresh
/// schema of its own).
fn held_config(schema: &str) -> PgOutboxConfig {
    PgOutboxConfig::default()
        .with_schema(schema)
        .with_claim_mode(ClaimMode::HeldLock)
}

/// A held-lock outbox on its own pool whose sessions carry `application_name`, so a
/// test can end them all as if its process died.
async fn held_outbox(url: &str, schema: &str, application_name: &str) -> PgOutbox {
    let pool = common::pool_named(url, 4, application_name).await;
    // Every claim sweeps, so a dead batch is charged before the next claim.
    let config = held_config(schema).with_sweep_interval(Duration::ZERO);
    let outbox = PgOutbox::new(pool, config).unwrap();
    outbox.install().await.unwrap();
    outbox
}

/// End every session named `application_name` (from `admin`, a pool of another name),
/// as the server does when the process holding them dies, and wait until they are gone.
async fn kill_sessions(admin: &PgPool, application_name: &str) {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(application_name)
    .execute(admin)
    .await
    .unwrap();
    common::wait_until("the killed sessions to end", || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(application_name)
                .fetch_one(admin)
                .await
                .unwrap();
        left == 0
    })
    .await;
}

async fn one_claim(store: &dyn OutboxStore) -> Vec<outbox_core::store::ClaimedMessage> {
    store
        .claim(ClaimRequest::new(10, LONG).unwrap())
        .await
        .unwrap()
        .into_messages()
}

pg_test! {
    /// The row a held claim takes keeps its row version (`xmin`) and every column: the
    /// claim wrote nothing.
    async fn a_held_claim_writes_nothing_to_its_rows(
        (pool, outbox) = pg_outbox("held-lock claims", 4, held_config(""))
    ) {
        enqueue(&outbox, &[msg(0)]).await;
        let row = format!(
            "SELECT xmin::text, attempts, lease_token IS NULL, available_at::text FROM {}",
            table(&outbox)
        );
        let before: (String, i32, bool, String) =
            sqlx::query_as(&row).fetch_one(&pool).await.unwrap();
        let got = one_claim(&outbox).await;
        assert_eq!(got[0].message.attempts, 1, "the attempt it starts");
        let during: (String, i32, bool, String) =
            sqlx::query_as(&row).fetch_one(&pool).await.unwrap();
        assert_eq!(during, before, "the claim wrote nothing to the row");
        let stats = outbox.stats().await.unwrap();
        assert_eq!(
            (stats.pending, stats.in_flight),
            (0, 1),
            "held counts in flight"
        );
        assert_eq!(outbox.held_pool().map(|(_, open)| open), Some(1));
        outbox.complete_one(&got[0].lease).await.unwrap();
        assert_eq!(outbox.held_pool().map(|(_, open)| open), Some(0));
    }

    /// The transaction a claim keeps ready between batches may lose its session (a server
    /// that ends idle transactions, a restart): the next claim begins a new one.
    async fn a_claim_recovers_when_its_ready_transaction_lost_its_session(
        url = common::service_url("held-lock claims")
    ) {
        let schema = common::schema_name();
        let name = format!("held-ready-{schema}");
        let outbox = held_outbox(&url, &schema, &name).await;
        let admin = common::pool(&url, 2).await;
        // An empty claim leaves its transaction ready; its session then ends.
        assert!(one_claim(&outbox).await.is_empty());
        let idle = "SELECT count(*) FROM pg_stat_activity \
                    WHERE application_name = $1 AND state = 'idle in transaction'";
        let ready: i64 = sqlx::query_scalar(idle)
            .bind(&name)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert_eq!(ready, 1, "one transaction kept ready");
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND state = 'idle in transaction'",
        )
        .bind(&name)
        .execute(&admin)
        .await
        .unwrap();
        common::wait_until("the ready session to end", || async {
            let left: i64 = sqlx::query_scalar(idle)
                .bind(&name)
                .fetch_one(&admin)
                .await
                .unwrap();
            left == 0
        })
        .await;
        enqueue(&outbox, &[msg(0)]).await;
        let got = one_claim(&outbox).await;
        assert_eq!(got.len(), 1, "claimed on a new transaction");
        outbox.complete_one(&got[0].lease).await.unwrap();
    }

    /// A relay process dies holding a batch: its rows are claimable at once, the next
    /// claim (another process) sees the attempt charged, and the dead batch's settle is
    /// lost.
    async fn a_batch_whose_session_dies_is_charged_its_attempt(
        url = common::service_url("held-lock claims")
    ) {
        let schema = common::schema_name();
        let doomed_name = format!("held-doomed-{schema}");
        let doomed = held_outbox(&url, &schema, &doomed_name).await;
        let survivor = held_outbox(&url, &schema, &format!("held-survivor-{schema}")).await;
        enqueue(&doomed, &[msg(0), msg(1)]).await;
        let held = one_claim(&doomed).await;
        assert_eq!(held.len(), 2);
        assert!(
            one_claim(&survivor).await.is_empty(),
            "held rows are skipped"
        );

        kill_sessions(survivor.pool(), &doomed_name).await;
        let again = common::poll_for("the dead batch's rows to be claimable", || {
            let survivor = &survivor;
            async move {
                let got = one_claim(survivor).await;
                (!got.is_empty()).then_some(got)
            }
        })
        .await;
        assert_eq!(again.len(), 2);
        assert!(
            again.iter().all(|c| c.message.attempts == 2),
            "the dead batch's attempt was charged: {:?}",
            again.iter().map(|c| c.message.attempts).collect::<Vec<_>>()
        );
        let lost = doomed.complete(&[held[0].lease]).await.unwrap();
        assert_eq!(
            lost.lost,
            vec![held[0].lease.id],
            "the dead batch settles nothing"
        );
        let leases: Vec<_> = again.iter().map(|c| c.lease).collect();
        survivor
            .complete(&leases)
            .await
            .unwrap()
            .into_result()
            .unwrap();
        let registry: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}",
            table(&survivor).replace("\"outbox_messages\"", "\"outbox_messages_held\"")
        ))
        .fetch_one(survivor.pool())
        .await
        .unwrap();
        assert_eq!(
            registry, 0,
            "the registry holds nothing once every batch ended"
        );
    }

    /// A message whose publish kills its relay, again and again, is dead-lettered once
    /// its attempts are spent, without being published again: each dead batch is charged.
    async fn a_message_that_kills_every_relay_is_dead_lettered(
        url = common::service_url("held-lock claims")
    ) {
        let schema = common::schema_name();
        let admin = common::pool(&url, 2).await;
        let max_attempts = 3;
        let config = || {
            RelayConfig::default()
                .with_lease(Duration::from_secs(30))
                .with_poll_interval(Duration::from_millis(10))
                .with_max_poll_interval(Duration::from_millis(100))
                .with_retry(RetryPolicy::new(max_attempts))
        };
        let poison = msg(0);
        let poison_id = poison.id();
        for round in 0..max_attempts {
            let name = format!("held-kill-{round}-{schema}");
            let outbox = held_outbox(&url, &schema, &name).await;
            if round == 0 {
                enqueue(&outbox, std::slice::from_ref(&poison)).await;
            }
            // The publish hangs, as a publish that crashes the process would never return.
            let (publisher, _never) = RecordingPublisher::new().hold_destination("pg.tests");
            let relay = Relay::new(
                Arc::new(outbox.clone()),
                Arc::new(publisher.clone()),
                config(),
            )
            .unwrap()
            .spawn();
            publisher.wait_for_calls(1, common::DEADLINE).await.unwrap();
            // The process dies: its relay stops where it is, and its sessions end.
            relay.abort().await;
            kill_sessions(&admin, &name).await;
        }
        let last = held_outbox(&url, &schema, &format!("held-last-{schema}")).await;
        let publisher = RecordingPublisher::new();
        let relay = Relay::new(
            Arc::new(last.clone()),
            Arc::new(publisher.clone()),
            config(),
        )
        .unwrap()
        .spawn();
        common::wait_until("the poison to be dead-lettered", || async {
            last.stats().await.unwrap().dead == 1
        })
        .await;
        let report = relay.shutdown().await.unwrap();
        assert_eq!(report.dead_lettered, 1);
        assert_eq!(publisher.times_seen(poison_id), 0, "not published again");
        let dead = last
            .dead_letters(&outbox_core::DeadLetterPage::new(Default::default(), 10).unwrap())
            .await
            .unwrap();
        assert_eq!(dead[0].message.id, poison_id);
        assert_eq!(dead[0].message.attempts, max_attempts + 1);
        let error = dead[0].message.last_error.as_deref().unwrap_or_default();
        assert!(error.contains("without an outcome"), "{error}");
    }

    /// Stats, requeue, discard and purge skip held rows and never wait for them.
    async fn operator_calls_never_wait_on_held_rows(pool = common::connect("held-lock claims", 6)) {
        let config =
            held_config(&common::schema_name()).with_retention(outbox_core::Retention::Keep {
                window: Duration::from_secs(3600),
            });
        let outbox = PgOutbox::new(pool.clone(), config).unwrap();
        outbox.install().await.unwrap();
        enqueue(&outbox, &[msg(0), msg(1)]).await;
        // One dead letter, dead-lettered and committed in a batch of its own.
        let first = outbox
            .claim(ClaimRequest::new(1, LONG).unwrap())
            .await
            .unwrap()
            .into_messages();
        let dead = outbox_core::store::Failure::new(
            first[0].lease,
            "poison",
            outbox_core::store::Disposition::DeadLetter,
        );
        outbox.fail_one(dead).await.unwrap();
        // The other stays held.
        let held = one_claim(&outbox).await;
        assert_eq!(held.len(), 1);
        let ids: Vec<MessageId> = vec![held[0].message.id, first[0].message.id];
        let stats = within("stats", outbox.stats()).await.unwrap();
        assert_eq!((stats.pending, stats.in_flight, stats.dead), (0, 1, 1));
        let requeue = DeadLetterSelection::Ids(vec![held[0].message.id]);
        assert_eq!(
            within("requeue", outbox.requeue_dead(&requeue))
                .await
                .unwrap(),
            0
        );
        let discard = DeadLetterSelection::Ids(ids);
        assert_eq!(
            within("discard", outbox.discard_dead(&discard))
                .await
                .unwrap(),
            1,
            "the dead letter only"
        );
        assert_eq!(
            within("purge", outbox.purge_dispatched(Duration::ZERO, 10))
                .await
                .unwrap(),
            0
        );
        outbox.complete_one(&held[0].lease).await.unwrap();
        let err = outbox.complete_one(&held[0].lease).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
    }
}

/// A relay that could need more batches than the store's held connections is refused
/// at construction, naming the numbers.
#[tokio::test]
async fn a_relay_needing_more_held_connections_than_the_store_has_is_refused() {
    let pool = sqlx::PgPool::connect_lazy("postgres://127.0.0.1:1/never").unwrap();
    let outbox = PgOutbox::new(pool, held_config("s").with_held_connections(2)).unwrap();
    let store: Arc<dyn OutboxStore> = Arc::new(outbox);
    let publisher = Arc::new(RecordingPublisher::new());
    let err = Relay::new(
        Arc::clone(&store),
        publisher.clone(),
        RelayConfig::default().with_pipeline_depth(2),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(
        err.to_string().contains("at most 2 claimed batches"),
        "{err}"
    );
    assert!(err.to_string().contains("needs 3"), "{err}");
    Relay::new(
        store,
        publisher,
        RelayConfig::default().with_pipeline_depth(1),
    )
    .expect("depth 1 plus one dispatch fits in 2");
}

pg_test! {
    /// A row another tool broke is dead-lettered by the held claim that meets it, in the
    /// claim's transaction, and the rest of the batch is delivered.
    async fn a_held_claim_dead_letters_poison_rows(
        (pool, outbox) = pg_outbox("held-lock claims", 4, held_config(""))
    ) {
        enqueue(&outbox, &[msg(0), msg(1)]).await;
        let poison = MessageId::new();
        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, payload, headers, available_at) \
             VALUES ($1, 'pg.tests', '\\x00', '[1, 2]', now() - interval '1 hour')",
            table(&outbox)
        ))
        .bind(poison.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
        let claimed = outbox
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        assert_eq!((claimed.len(), claimed.dead_lettered), (2, 1));
        let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
        outbox
            .complete(&leases)
            .await
            .unwrap()
            .into_result()
            .unwrap();
        let dead = outbox
            .dead_letters(&outbox_core::DeadLetterPage::new(Default::default(), 10).unwrap())
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].message.id, poison);
        let error = dead[0].message.last_error.as_deref().unwrap_or_default();
        assert!(error.contains("undecodable row"), "{error}");
        assert_eq!(outbox.stats().await.unwrap().pending, 0);
    }

    /// A settle the server refuses (here a trigger another tool installed) ends the batch,
    /// rolled back at once, and comes back as the error, not as lost leases; the messages are due
    /// again at once.
    async fn a_refused_settle_is_an_error_and_rolls_the_batch_back(
        pool = common::connect("held-lock claims", 4)
    ) {
        // Only the first claim sweeps, so the attempt seen below is the stored one.
        let config = held_config(&common::schema_name()).with_sweep_interval(LONG);
        let outbox = PgOutbox::new(pool.clone(), config).unwrap();
        outbox.install().await.unwrap();
        enqueue(&outbox, &[msg(0)]).await;
        let t = table(&outbox);
        let schema = outbox.config().schema();
        sqlx::raw_sql(&format!(
            "CREATE FUNCTION \"{schema}\".refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$; \
             CREATE TRIGGER refuse BEFORE DELETE ON {t} \
             FOR EACH ROW EXECUTE FUNCTION \"{schema}\".refuse();"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let got = one_claim(&outbox).await;
        let err = outbox.complete(&[got[0].lease]).await.unwrap_err();
        assert!(err.to_string().contains("complete"), "{err}");
        assert_eq!(
            outbox.held_pool().map(|(_, open)| open),
            Some(0),
            "the batch ended"
        );
        // Rolled back at once, not when its connection is next used: another session can
        // lock the row without waiting.
        sqlx::query(&format!("SELECT id FROM {t} FOR UPDATE NOWAIT"))
            .fetch_all(&pool)
            .await
            .expect("the ended batch's row lock is gone");
        let again = one_claim(&outbox).await;
        assert_eq!(again.len(), 1, "due again at once");
        assert_eq!(again[0].message.attempts, 1, "no attempt was written");
    }

    /// A settle call carrying leases of several batches applies each in its own batch's
    /// transaction (never touching another batch's rows, which would wait on its lock).
    async fn one_settle_spanning_batches_applies_each_in_its_own(
        (_, outbox) = pg_outbox("held-lock claims", 4, held_config(""))
    ) {
        enqueue(&outbox, &[msg(0), msg(1)]).await;
        let first = one_claim_of(&outbox, 1).await;
        let second = one_claim_of(&outbox, 1).await;
        assert_ne!(first[0].lease.token, second[0].lease.token, "two batches");
        let failures: Vec<_> = [&first[0], &second[0]]
            .iter()
            .map(|c| {
                outbox_core::store::Failure::new(
                    c.lease,
                    "broker down",
                    outbox_core::store::Disposition::Retry {
                        after: Duration::ZERO,
                    },
                )
            })
            .collect();
        let failed = within("fail across batches", outbox.fail(&failures))
            .await
            .unwrap();
        assert_eq!((failed.applied, failed.lost.len()), (2, 0));
        let again = one_claim(&outbox).await;
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|c| c.message.attempts == 2));
    }

    /// The sweep runs at most every interval: a batch that died is charged by the first
    /// sweep after that, or at once by `sweep_held`, which counts what it charged (and
    /// leaves messages a live claim holds for a later sweep).
    async fn the_sweep_keeps_its_interval_and_counts_what_it_charged(
        url = common::service_url("held-lock claims")
    ) {
        let schema = common::schema_name();
        let doomed_name = format!("held-doomed-{schema}");
        let doomed = held_outbox(&url, &schema, &doomed_name).await;
        let pool = common::pool(&url, 4).await;
        let patient =
            PgOutbox::new(pool.clone(), held_config(&schema).with_sweep_interval(LONG)).unwrap();
        // The patient store's first claim sweeps; none follows within the hour.
        assert!(one_claim(&patient).await.is_empty());
        enqueue(&doomed, &[msg(0), msg(1)]).await;
        // Two batches die, so one sweep has two to charge.
        assert_eq!(one_claim_of(&doomed, 1).await.len(), 1);
        assert_eq!(one_claim_of(&doomed, 1).await.len(), 1);
        kill_sessions(&pool, &doomed_name).await;
        let again = one_claim(&patient).await;
        assert!(
            again.iter().all(|c| c.message.attempts == 1),
            "not charged before the interval"
        );
        assert_eq!(patient.sweep_held().await.unwrap(), 0, "held rows wait");
        let leases: Vec<_> = again.iter().map(|c| c.lease).collect();
        patient
            .release(&leases)
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(
            patient.sweep_held().await.unwrap(),
            2,
            "both batches charged in one sweep, once each"
        );
        let charged = one_claim(&patient).await;
        assert!(charged.iter().all(|c| c.message.attempts == 2));
    }
}

async fn one_claim_of(
    store: &dyn OutboxStore,
    limit: usize,
) -> Vec<outbox_core::store::ClaimedMessage> {
    store
        .claim(ClaimRequest::new(limit, LONG).unwrap())
        .await
        .unwrap()
        .into_messages()
}
