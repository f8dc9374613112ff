//! Process-level chaos: `chaos-worker` relay processes SIGKILLed mid-drain (on
//! PostgreSQL, on MariaDB, and on DynamoDB Local under injected faults), the PostgreSQL
//! server restarted under them, poison rows planted beside normal messages, a message
//! whose publish aborts the worker process (on PostgreSQL and MariaDB, both claim
//! modes).
//! Every publish is a row of `<schema>.published`, which is what the checks read.
//!
//! ```sh
//! eval "$(scripts/services.sh)"
//! cargo test -p outbox-chaos -- --nocapture   # one line per test
//! ```
//!
//! On 2 cores the cases take 10-20 s together, plus 90-140 s for the DynamoDB Local
//! one (skipped without `OUTBOX_DYNAMODB_URL`).
//!
//! Each test uses its own schema and runs alone (see `support::serial`), on a
//! multi-thread runtime so the workers' output pipes are drained whatever the test's
//! own task is doing.

mod support;

use std::time::{Duration, Instant};

use outbox_chaos::BATCH_SIZE;
use outbox_core::KeyOrder;

use support::cluster::{Cluster, Unavailable};
use support::poison::{self, Trial};
use support::{Worker, WorkerSpec, TABLE};

/// The documented duplicate window of one relay killed at any point: every batch it
/// may hold published but unsettled, `pipeline_depth x batch_size` messages.
fn window() -> usize {
    outbox_chaos::relay_config("window").pipeline_depth * BATCH_SIZE
}

/// Three per-key workers drain 3000 messages over 50 keys while a random one is
/// SIGKILLed and restarted ten times: nothing is lost or dead-lettered, duplicates stay
/// within what the kills explain, and first publishes keep per-key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_lose_nothing() {
    sigkilled_postgres_workers("chaos sigkill", false, 10).await;
}

/// As [`sigkilled_workers_lose_nothing`] with held-lock claims, over twenty kills: a
/// killed worker's rows are claimable as soon as the server ends its sessions, so the
/// failover printed beside the lease run's is the time to the first republish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_held_lock_workers_lose_nothing() {
    sigkilled_postgres_workers("chaos sigkill held-lock", true, 20).await;
}

async fn sigkilled_postgres_workers(label: &str, held_lock: bool, kills: usize) {
    const MESSAGES: usize = 3000;
    const KEYS: usize = 50;
    const WORKERS: usize = 3;
    let Some(url) = support::url("chaos: SIGKILLed relay workers") else {
        return;
    };
    let _serial = support::serial().await;
    let started = Instant::now();
    let pool = support::connect_shared(&url, 4).await;
    let schema = support::schema_name();
    let table = support::qualified(&schema, TABLE);
    let outbox = support::install(&pool, &schema, TABLE, KeyOrder::PerKey).await;
    let sent = support::enqueue_keyed(&outbox, MESSAGES, KEYS).await;
    let spec = WorkerSpec {
        url: url.clone(),
        schema: schema.clone(),
        table: TABLE.to_owned(),
        order: KeyOrder::PerKey,
        pool_size: 4,
        mysql_url: None,
        dynamodb_url: None,
        held_lock,
        crash: None,
    };
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|n| Worker::spawn(&spec, format!("w{n}")))
        .collect();

    // Kill at progress points spread over the drain, with some jitter.
    let step = MESSAGES / (kills + 2);
    let mut killed = Vec::with_capacity(kills);
    for kill in 1..=kills {
        let target = i64::try_from(step * kill + fastrand::usize(..step / 2)).unwrap();
        let (pool, schema) = (&pool, schema.as_str());
        support::wait_with_workers(
            &format!("{target} messages published before kill {kill}"),
            &mut workers,
            || async move { support::published_distinct(pool, schema).await >= target },
        )
        .await;
        let victim = fastrand::usize(..WORKERS);
        workers[victim].kill().await;
        killed.push((workers[victim].id.clone(), support::db_now(pool).await));
        let left = support::undelivered(pool, &table).await;
        assert!(left > 0, "kill {kill} came after the drain had finished");
        workers[victim] = Worker::spawn(&spec, format!("w{victim}.{kill}"));
    }
    let (p, t) = (&pool, table.as_str());
    support::wait_with_workers("the outbox to drain", &mut workers, || async move {
        support::undelivered(p, t).await == 0
    })
    .await;
    for worker in workers {
        let id = worker.id.clone();
        let status = worker.stop().await;
        assert!(status.success(), "worker {id} stopped with {status}");
    }

    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let dead = support::dead(&pool, &table).await;
    let failover = support::failover(&pool, &schema, &killed).await;
    // A worker's relay loop holds at most `pipeline_depth` claimed batches that are
    // published (or publishing) but not yet settled: the batches in flight, and those
    // whose settle rides with the claim on the wire. A SIGKILL can therefore leave at
    // most pipeline_depth x BATCH_SIZE messages published but not completed (the
    // documented duplicate window); they are published again when their leases lapse,
    // or, with held locks, as soon as the server ends the dead worker's sessions.
    // Nothing else republishes here: the server stays up and publishes (one local
    // INSERT each) stay far below the 1 s publish timeout.
    let bound = i64::try_from(kills * window()).unwrap();
    println!(
        "{label}: messages={MESSAGES} keys={KEYS} workers={WORKERS} kills={kills} \
         lost={} duplicates={} bound={bound} dead={dead} failover={failover} elapsed={:.1?}",
        delivery.lost,
        delivery.duplicates,
        started.elapsed()
    );
    delivery.assert_within(bound);
    assert_eq!(dead, 0, "no message should be dead-lettered");
    support::drop_schema(&pool, &schema).await;
}

/// As [`sigkilled_workers_lose_nothing`], with the outbox on MariaDB (or MySQL): three
/// per-key workers drain 2000 messages over 40 keys while a random one is SIGKILLed
/// and restarted eight times. Publishes are still recorded on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_lose_nothing_on_mariadb() {
    sigkilled_mariadb_workers("chaos sigkill mariadb", false, 8).await;
}

/// As [`sigkilled_workers_lose_nothing_on_mariadb`] with held-lock claims, over twenty
/// kills: a killed worker's rows are claimable as soon as MariaDB notices its closed
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_held_lock_workers_lose_nothing_on_mariadb() {
    sigkilled_mariadb_workers("chaos sigkill mariadb held-lock", true, 20).await;
}

async fn sigkilled_mariadb_workers(label: &str, held_lock: bool, kills: usize) {
    const MESSAGES: usize = 2000;
    const KEYS: usize = 40;
    const WORKERS: usize = 3;
    let Some(url) = support::url("chaos on MariaDB: the published table") else {
        return;
    };
    let Some(mysql_url) = support::mariadb::url("chaos on MariaDB: SIGKILLed relay workers") else {
        return;
    };
    let _serial = support::serial().await;
    let started = Instant::now();
    let pool = support::connect_shared(&url, 4).await;
    let schema = support::schema_name();
    let outbox =
        support::mariadb::install_with_published(&pool, &mysql_url, &schema, KeyOrder::PerKey)
            .await;
    let sent = support::mariadb::enqueue_keyed(&outbox, MESSAGES, KEYS).await;
    let spec = WorkerSpec {
        url: url.clone(),
        schema: schema.clone(),
        table: TABLE.to_owned(),
        order: KeyOrder::PerKey,
        pool_size: 4,
        mysql_url: Some(mysql_url),
        dynamodb_url: None,
        held_lock,
        crash: None,
    };
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|n| Worker::spawn(&spec, format!("m{n}")))
        .collect();
    let undelivered = "dispatched_at IS NULL AND dead_at IS NULL";
    let step = MESSAGES / (kills + 2);
    let mut killed = Vec::with_capacity(kills);
    for kill in 1..=kills {
        let target = i64::try_from(step * kill + fastrand::usize(..step / 2)).unwrap();
        let (pool, schema) = (&pool, schema.as_str());
        support::wait_with_workers(
            &format!("{target} messages published before kill {kill}"),
            &mut workers,
            || async move { support::published_distinct(pool, schema).await >= target },
        )
        .await;
        let victim = fastrand::usize(..WORKERS);
        workers[victim].kill().await;
        killed.push((workers[victim].id.clone(), support::db_now(pool).await));
        let left = support::mariadb::count(&outbox, undelivered).await;
        assert!(left > 0, "kill {kill} came after the drain had finished");
        workers[victim] = Worker::spawn(&spec, format!("m{victim}.{kill}"));
    }
    let o = &outbox;
    support::wait_with_workers("the outbox to drain", &mut workers, || async move {
        support::mariadb::count(o, undelivered).await == 0
    })
    .await;
    for worker in workers {
        let id = worker.id.clone();
        let status = worker.stop().await;
        assert!(status.success(), "worker {id} stopped with {status}");
    }
    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let dead = support::mariadb::count(&outbox, "dead_at IS NOT NULL").await;
    let failover = support::failover(&pool, &schema, &killed).await;
    let bound = i64::try_from(kills * window()).unwrap();
    println!(
        "{label}: messages={MESSAGES} keys={KEYS} workers={WORKERS} kills={kills} lost={} \
         duplicates={} bound={bound} dead={dead} failover={failover} elapsed={:.1?}",
        delivery.lost,
        delivery.duplicates,
        started.elapsed()
    );
    delivery.assert_within(bound);
    assert_eq!(dead, 0, "no message should be dead-lettered");
    support::mariadb::drop_database(&outbox).await;
    support::drop_schema(&pool, &schema).await;
}

/// A message whose publish kills its relay (the worker process aborts before the
/// publish, SIGABRT) is dead-lettered after `max_attempts` crashes, in both claim modes
/// on PostgreSQL and on MariaDB, and the messages of its key and the others around it
/// are delivered. Every crash must be charged exactly one attempt: with leases by the
/// claim's stamp, with held locks (a rolled-back claim records nothing) by the next
/// relay's sweep of the dead batch's registry row. So the crashes number exactly
/// `max_attempts`: a crash left uncharged would add one, a crash charged twice would
/// dead-letter the message one crash early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_relay_is_dead_lettered() {
    let Some(url) = support::url("chaos: a message that kills its relay") else {
        return;
    };
    let _serial = support::serial().await;
    for held_lock in [false, true] {
        crashing_message(&url, None, held_lock).await;
    }
    if let Some(mysql_url) =
        support::mariadb::url("chaos on MariaDB: a message that kills its relay")
    {
        for held_lock in [false, true] {
            crashing_message(&url, Some(&mysql_url), held_lock).await;
        }
    }
}

/// One run of [`a_message_that_kills_its_relay_is_dead_lettered`]: the outbox on
/// MariaDB when `mysql_url` is given, on PostgreSQL otherwise.
async fn crashing_message(url: &str, mysql_url: Option<&str>, held_lock: bool) {
    use std::os::unix::process::ExitStatusExt;

    use outbox_core::{DeadLetterFilter, DeadLetterPage, NewMessage, OutboxAdmin};

    const NORMALS: usize = 40;
    const KEYS: usize = 4;
    const MAX_ATTEMPTS: u32 = 3;
    const CRASH: &str = "chaos.crash";
    let label = format!(
        "chaos crashing message {} {}",
        if mysql_url.is_some() {
            "mariadb"
        } else {
            "postgres"
        },
        if held_lock { "held-lock" } else { "lease" }
    );
    let started = Instant::now();
    let pool = support::connect_shared(url, 4).await;
    let schema = support::schema_name();
    // The crash heads `key-000`: that key's other messages wait until it is dead.
    let crash = NewMessage::builder(CRASH)
        .partition_key(poison::SHARED_KEY)
        .payload(b"crash".to_vec())
        .build()
        .expect("a valid message");
    let crash_id = crash.id();
    let (normals, sent) = support::keyed_messages(NORMALS, KEYS, &mut fastrand::Rng::new());
    let messages: Vec<NewMessage> = std::iter::once(crash).chain(normals).collect();
    let (admin, mariadb): (Box<dyn OutboxAdmin>, _) = match mysql_url {
        None => {
            let outbox = support::install(&pool, &schema, TABLE, KeyOrder::PerKey).await;
            let mut tx = outbox.pool().begin().await.expect("begin");
            outbox.enqueue(&mut tx, &messages).await.expect("enqueue");
            tx.commit().await.expect("commit");
            (Box::new(outbox), None)
        }
        Some(mysql_url) => {
            let outbox = support::mariadb::install_with_published(
                &pool,
                mysql_url,
                &schema,
                KeyOrder::PerKey,
            )
            .await;
            let mut tx = outbox.pool().begin().await.expect("begin");
            outbox.enqueue(&mut tx, &messages).await.expect("enqueue");
            tx.commit().await.expect("commit");
            (Box::new(outbox.clone()), Some(outbox))
        }
    };
    let spec = WorkerSpec {
        url: url.to_owned(),
        schema: schema.clone(),
        table: TABLE.to_owned(),
        order: KeyOrder::PerKey,
        pool_size: 4,
        mysql_url: mysql_url.map(str::to_owned),
        dynamodb_url: None,
        held_lock,
        crash: Some(support::Crash {
            destination: CRASH.to_owned(),
            max_attempts: MAX_ATTEMPTS,
        }),
    };

    let mut worker = Worker::spawn(&spec, "c0");
    let mut crashes = 0;
    loop {
        let stats = admin.stats().await.expect("read the outbox's stats");
        if stats.pending + stats.in_flight == 0 && stats.dead > 0 {
            break;
        }
        if let Some(status) = worker.exited() {
            assert_eq!(
                status.signal(),
                Some(6),
                "{label}: worker {} ended with {status}, not by the crash:\n{}",
                worker.id,
                worker.log_tail(20)
            );
            let said = worker.log_lines_with("crashing on message");
            assert_eq!(said.len(), 1, "{label}: {said:?}");
            assert!(said[0].contains(&crash_id.to_string()), "{label}: {said:?}");
            crashes += 1;
            assert!(
                crashes <= MAX_ATTEMPTS,
                "{label}: {crashes} crashes, more than the {MAX_ATTEMPTS} attempts allowed \
                 (a crash went uncharged): {stats:?}"
            );
            worker = Worker::spawn(&spec, format!("c{crashes}"));
        }
        assert!(
            started.elapsed() < support::DEADLINE,
            "{label}: not settled after {:?}: {crashes} crashes, {stats:?}\n{}",
            support::DEADLINE,
            worker.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = worker.stop().await;
    assert!(
        status.success(),
        "{label}: the last worker stopped with {status}"
    );

    let dead = admin
        .dead_letters(&DeadLetterPage::new(DeadLetterFilter::default(), 100).expect("a page"))
        .await
        .expect("list dead letters");
    let crashed = dead
        .iter()
        .find(|d| d.message.id == crash_id)
        .unwrap_or_else(|| panic!("{label}: the crashing message is not dead: {dead:?}"));
    assert_eq!(
        crashes, MAX_ATTEMPTS,
        "{label}: dead-lettered after {crashes} crashes, not {MAX_ATTEMPTS} (a crash was \
         charged more than once): {:?}",
        crashed.message
    );
    assert_eq!(crashed.message.attempts, MAX_ATTEMPTS + 1, "{label}");
    // Every message the crashing batches held unsettled was charged with each crash: the
    // ones claimed with it every time share its fate, for the same reason.
    for d in &dead {
        let why = d.message.last_error.as_deref().unwrap_or_default();
        assert!(
            why.contains("ended without an outcome"),
            "{label}: {} dead for another reason: {why}",
            d.message.id
        );
    }
    let collateral: std::collections::HashSet<uuid::Uuid> = dead
        .iter()
        .filter(|d| d.message.id != crash_id)
        .map(|d| d.message.id.as_uuid())
        .collect();
    assert!(
        collateral.len() < window(),
        "{label}: {} messages died with the crashing one, more than its batches held",
        collateral.len()
    );
    // The collateral may have been published before a crash (and never completed):
    // check order and duplicates over every message, loss over the survivors.
    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let published: std::collections::HashSet<uuid::Uuid> = sqlx::query_scalar(&format!(
        "SELECT DISTINCT message_id FROM \"{schema}\".published"
    ))
    .fetch_all(&pool)
    .await
    .expect("read the published table")
    .into_iter()
    .collect();
    let lost: Vec<uuid::Uuid> = sent
        .iter()
        .map(|s| s.id)
        .filter(|id| !collateral.contains(id) && !published.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{label}: survivors never published: {lost:?}"
    );
    let bound = i64::from(MAX_ATTEMPTS) * i64::try_from(window()).unwrap();
    println!(
        "{label}: crashes={crashes} dead attempts={} collateral={} lost={} duplicates={} \
         bound={bound} elapsed={:.1?}",
        crashed.message.attempts,
        collateral.len(),
        lost.len(),
        delivery.duplicates,
        started.elapsed()
    );
    delivery.assert_published_within(bound);
    if let Some(outbox) = mariadb {
        support::mariadb::drop_database(&outbox).await;
    }
    support::drop_schema(&pool, &schema).await;
}

/// As [`sigkilled_workers_lose_nothing`], with the outbox on DynamoDB Local and every
/// worker's requests under injected faults (`outbox_chaos::dynamodb::fault_mix`: 5%
/// throttles of every data-plane attempt, 1% of transactions cancelled for a conflict,
/// 5% of index queries answered from before): four per-key workers with 2-second shard
/// leases drain 1500 messages over 40 keys while a random one is SIGKILLed and
/// restarted ten times. The last 300 messages are enqueued during the drain, one per
/// transaction, under the same fault mix, so cancelled transactions meet the caller's
/// retries (the workers send few transactions of their own). Nothing is lost,
/// dead-lettered or left undelivered, duplicates stay within what the kills explain,
/// and first publishes keep per-key order. Publishes are still recorded on PostgreSQL.
///
/// The run's seed (`OUTBOX_FAULT_SEED`, random when unset, printed) picks the keys,
/// the kill points and the victims, and seeds the workers' injectors (worker process
/// `n`, restarts counted, gets the seed plus `n`; the late enqueue the seed minus 1).
/// DynamoDB Local is slow: the case takes 85-140 s on 2 idle cores (measured 85-93 s on
/// one machine, 132-137 s on another, the same with or without the late enqueue, which
/// takes 7-8 s beside the drain: 5-7 s to enqueue, then a drain of 11-17 messages a
/// second through the kills).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_lose_nothing_on_dynamodb() {
    const MESSAGES: usize = 1500;
    /// Enqueued during the drain, under the faults.
    const LATE: usize = 300;
    const KEYS: usize = 40;
    const WORKERS: usize = 4;
    const KILLS: usize = 10;
    let Some(url) = support::url("chaos on DynamoDB: the published table") else {
        return;
    };
    let Some(dynamodb_url) = support::dynamodb::url("chaos on DynamoDB: SIGKILLed relay workers")
    else {
        return;
    };
    let _serial = support::serial().await;
    let started = Instant::now();
    let seed = support::dynamodb::seed();
    eprintln!(
        "chaos on DynamoDB: seed {seed} (replay with {}={seed})",
        support::dynamodb::SEED_VAR
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    let pool = support::connect_shared(&url, 4).await;
    let schema = support::schema_name();
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{schema}\"; {}",
        outbox_chaos::published_ddl(&schema)
    ))
    .execute(&pool)
    .await
    .expect("create the published table");
    // DynamoDB has no schemas: the table is named like the test's schema.
    let outbox = support::dynamodb::install(&dynamodb_url, &schema, KeyOrder::PerKey).await;
    let (mut messages, sent) = support::keyed_messages(MESSAGES, KEYS, &mut rng);
    let later = messages.split_off(MESSAGES - LATE);
    support::dynamodb::enqueue_all(&outbox, &messages).await;
    let enqueued = started.elapsed();
    // The rest while the workers drain, one message per transaction under the faults.
    let late = tokio::spawn({
        let (url, table) = (dynamodb_url.clone(), schema.clone());
        let seed = seed.wrapping_sub(1);
        async move {
            let began = Instant::now();
            let faults = support::dynamodb::enqueue_under_faults(
                &url,
                &table,
                KeyOrder::PerKey,
                later,
                seed,
            )
            .await;
            (faults, began.elapsed())
        }
    });
    let spec = WorkerSpec {
        url: url.clone(),
        schema: schema.clone(),
        table: schema.clone(),
        order: KeyOrder::PerKey,
        pool_size: 4,
        mysql_url: None,
        dynamodb_url: Some(dynamodb_url),
        held_lock: false,
        crash: None,
    };
    let mut spawned = 0_u64;
    let mut spawn = |id: String| {
        let worker = Worker::spawn_seeded(&spec, id, seed.wrapping_add(spawned));
        spawned += 1;
        worker
    };
    let mut workers: Vec<Worker> = (0..WORKERS).map(|n| spawn(format!("d{n}"))).collect();
    // What the injectors injected, summed over the processes (killed ones as of their
    // last report, at most a second before the kill).
    let mut faults = outbox_chaos::dynamodb::FaultCounts::default();
    // Warnings the workers logged (failed claims and settles, batches released for
    // want of lease), killed ones included: evidence of what the faults cost.
    let mut warnings = 0;
    let all = i64::try_from(MESSAGES).unwrap();
    let step = MESSAGES / (KILLS + 2);
    for kill in 1..=KILLS {
        let target = i64::try_from(step * kill + rng.usize(..step / 2)).unwrap();
        let (pool, schema) = (&pool, schema.as_str());
        support::wait_with_workers(
            &format!("{target} messages published before kill {kill}"),
            &mut workers,
            || async move { support::published_distinct(pool, schema).await >= target },
        )
        .await;
        let victim = rng.usize(..WORKERS);
        workers[victim].kill().await;
        faults += support::dynamodb::faults_seen(&workers[victim]);
        warnings += workers[victim].warnings();
        let published = support::published_distinct(pool, schema).await;
        assert!(
            published < all,
            "kill {kill} came after the drain had finished"
        );
        workers[victim] = spawn(format!("d{victim}.{kill}"));
    }
    let (late_faults, late_took) = late.await.expect("the late enqueue");
    faults += late_faults;
    // Drained when the outbox counts nothing undelivered and `published` confirms it:
    // the counts come from eventually consistent indexes, so they may say so early.
    // They cost a query per shard and index, so they are read at most once a second
    // until `published` holds every message.
    let last_stats = std::cell::Cell::new(Instant::now());
    let (p, sc, o, last) = (&pool, schema.as_str(), &outbox, &last_stats);
    support::wait_with_workers("the outbox to drain", &mut workers, || async move {
        let published = support::published_distinct(p, sc).await;
        if published < all && last.get().elapsed() < Duration::from_secs(1) {
            return false;
        }
        last.set(Instant::now());
        let stats = support::dynamodb::stats(o).await;
        stats.pending + stats.in_flight == 0
            && published + i64::try_from(stats.dead).unwrap() >= all
    })
    .await;
    for worker in &workers {
        faults += support::dynamodb::faults_seen(worker);
        warnings += worker.warnings();
    }
    for worker in workers {
        let id = worker.id.clone();
        let status = worker.stop().await;
        assert!(status.success(), "worker {id} stopped with {status}");
    }

    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let stats = support::dynamodb::stats(&outbox).await;
    let stranded = stats.pending + stats.in_flight;
    // As on PostgreSQL, a SIGKILL leaves at most pipeline_depth x BATCH_SIZE messages
    // published but not completed. The faults add none: throttles and cancelled
    // transactions are injected before the request is applied and retried (or the
    // claim or settle fails and is retried), a lagging index costs refused claim
    // writes, and the SDK's ten attempts outlast a 5% throttle rate.
    let bound = i64::try_from(KILLS * window()).unwrap();
    println!(
        "chaos sigkill dynamodb: messages={MESSAGES} keys={KEYS} workers={WORKERS} \
         kills={KILLS} lost={} duplicates={} bound={bound} dead={} stranded={stranded} \
         injected: {faults} (the late enqueue's: {late_faults}) worker_warnings={warnings} seed={seed} \
         (workers {seed}+0..{spawned}, the late enqueue {seed}-1) enqueue={enqueued:.1?} \
         late_enqueue={late_took:.1?} \
         elapsed={:.1?}",
        delivery.lost,
        delivery.duplicates,
        stats.dead,
        started.elapsed()
    );
    delivery.assert_within(bound);
    assert_eq!(stats.dead, 0, "no message should be dead-lettered");
    assert_eq!(stranded, 0, "messages left undelivered: {stats:?}");
    support::dynamodb::drop_table(&outbox).await;
    support::drop_schema(&pool, &schema).await;
}

/// Two per-key workers drain a private PostgreSQL cluster that is restarted twice
/// mid-drain: they resume on their own and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_resume_after_postgres_restarts() {
    const MESSAGES: usize = 1500;
    const KEYS: usize = 30;
    const WORKERS: usize = 2;
    const RESTARTS: usize = 2;
    if support::url("chaos: PostgreSQL restarts").is_none() {
        return;
    }
    let _serial = support::serial().await;
    let started = Instant::now();
    let cluster = match Cluster::start() {
        Ok(cluster) => cluster,
        Err(Unavailable(why)) if outbox_testkit::integration_required() => {
            panic!(
                "cannot start a private PostgreSQL cluster but OUTBOX_REQUIRE_INTEGRATION=1: {why}"
            )
        }
        Err(Unavailable(why)) => {
            eprintln!("SKIPPED: chaos: PostgreSQL restarts: {why}");
            return;
        }
    };
    let url = cluster.url();
    let pool = support::connect(&url, 3).await;
    let schema = support::schema_name();
    let table = support::qualified(&schema, TABLE);
    let outbox = support::install(&pool, &schema, TABLE, KeyOrder::PerKey).await;
    let sent = support::enqueue_keyed(&outbox, MESSAGES, KEYS).await;
    let spec = WorkerSpec {
        url: url.clone(),
        schema: schema.clone(),
        table: TABLE.to_owned(),
        order: KeyOrder::PerKey,
        pool_size: 4,
        mysql_url: None,
        dynamodb_url: None,
        held_lock: false,
        crash: None,
    };
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|n| Worker::spawn(&spec, format!("w{n}")))
        .collect();

    let mut downtime = Duration::ZERO;
    for restart in 1..=RESTARTS {
        let target = i64::try_from(MESSAGES * restart / (RESTARTS + 1)).unwrap();
        let (pool, schema) = (&pool, schema.as_str());
        support::wait_with_workers(
            &format!("{target} messages published before restart {restart}"),
            &mut workers,
            || async move { support::published_distinct(pool, schema).await >= target },
        )
        .await;
        let restarting = Instant::now();
        cluster.restart().await;
        downtime += restarting.elapsed();
        let left = support::undelivered(pool, &table).await;
        assert!(
            left > 0,
            "restart {restart} came after the drain had finished"
        );
    }
    let (p, t) = (&pool, table.as_str());
    support::wait_with_workers(
        "the outbox to drain after the restarts",
        &mut workers,
        || async move { support::undelivered(p, t).await == 0 },
    )
    .await;
    // Evidence that the restarts were felt (failed claims, publishes, settles); the
    // log keeps each worker's last 200 lines only.
    let warnings: usize = workers.iter().map(Worker::warnings).sum();
    for worker in workers {
        let id = worker.id.clone();
        let status = worker.stop().await;
        assert!(status.success(), "worker {id} stopped with {status}");
    }

    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let dead = support::dead(&pool, &table).await;
    // A restart ends every session, so each worker may lose the settles of the batches
    // it holds (see the SIGKILL test): at most pipeline_depth x BATCH_SIZE republishes
    // per worker per restart.
    let bound = i64::try_from(RESTARTS * WORKERS * window()).unwrap();
    println!(
        "chaos pg-restart: messages={MESSAGES} keys={KEYS} workers={WORKERS} \
         restarts={RESTARTS} lost={} duplicates={} bound={bound} dead={dead} \
         worker_warnings={warnings} restart_time={downtime:.1?} elapsed={:.1?}",
        delivery.lost,
        delivery.duplicates,
        started.elapsed()
    );
    delivery.assert_within(bound);
    assert_eq!(dead, 0, "no message should be dead-lettered");
    // The cluster, schema included, is deleted when `cluster` drops.
    pool.close().await;
}

/// Messages per enqueuing transaction in the tests (`support::enqueue_keyed*`).
const TXN: usize = 100;

/// The documented duplicate window of a log-tailing relay killed while the server
/// stays up: what it published after the last position the server received. That
/// position lags by the messages of a transaction not yet wholly settled (confirmed
/// positions are transaction ends) and by those settled during the last status
/// interval, plus the calls in flight: bounded here by two transactions and a batch
/// per call in flight.
fn wal_window() -> usize {
    2 * TXN + outbox_chaos::WAL_BATCH_SIZE * outbox_chaos::WAL_PUBLISH_CONCURRENCY
}

/// The log-tailing relay (`chaos-wal-worker`, one active and one standby on the lock)
/// drains 3000 messages from a private cluster with `wal_level = logical` while a
/// random worker is SIGKILLed four times and the cluster restarted twice: nothing
/// lost or dead-lettered, first publishes in per-key (commit) order, duplicates within
/// the documented windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_relay_survives_sigkills_and_restarts() {
    const MESSAGES: usize = 3000;
    const KEYS: usize = 50;
    const WORKERS: usize = 2;
    /// What happens at each progress point: `true` kills a worker, `false` restarts
    /// the cluster.
    const EVENTS: [bool; 6] = [true, true, false, true, false, true];
    if support::url("chaos: log-tailing relay").is_none() {
        return;
    }
    let _serial = support::serial().await;
    let started = Instant::now();
    let cluster = match Cluster::start_with(&[
        ("wal_level", "logical"),
        ("max_wal_senders", "10"),
        ("max_replication_slots", "10"),
    ]) {
        Ok(cluster) => cluster,
        Err(Unavailable(why)) if outbox_testkit::integration_required() => {
            panic!(
                "cannot start a private PostgreSQL cluster but OUTBOX_REQUIRE_INTEGRATION=1: {why}"
            )
        }
        Err(Unavailable(why)) => {
            eprintln!("SKIPPED: chaos: log-tailing relay: {why}");
            return;
        }
    };
    let url = cluster.url();
    let pool = support::connect(&url, 3).await;
    let schema = support::schema_name();
    let table = support::qualified(&schema, TABLE);
    let outbox =
        outbox_postgres_wal::WalOutbox::new(pool.clone(), outbox_chaos::wal_outbox_config(&schema))
            .expect("a valid outbox config");
    outbox.install().await.expect("install the slot");
    sqlx::raw_sql(&outbox_chaos::published_ddl(&schema))
        .execute(&pool)
        .await
        .expect("create the published table");
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .expect("server version");
    let sent = support::enqueue_keyed_wal(&outbox, MESSAGES, KEYS).await;
    let spec = WorkerSpec {
        url: url.clone(),
        schema: schema.clone(),
        table: TABLE.to_owned(),
        order: KeyOrder::PerKey,
        pool_size: 3,
        mysql_url: None,
        dynamodb_url: None,
        held_lock: false,
        crash: None,
    };
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|n| Worker::spawn_wal(&spec, format!("w{n}")))
        .collect();

    let mut bound = 0_i64;
    let (mut kills, mut restarts) = (0, 0);
    for (n, &kill) in EVENTS.iter().enumerate() {
        let target = i64::try_from(MESSAGES * (n + 1) / (EVENTS.len() + 2)).unwrap();
        let (p, sc) = (&pool, schema.as_str());
        support::wait_with_workers(
            &format!("{target} messages published before event {n}"),
            &mut workers,
            || async move { support::published_distinct(p, sc).await >= target },
        )
        .await;
        if kill {
            kills += 1;
            let victim = fastrand::usize(..WORKERS);
            workers[victim].kill().await;
            workers[victim] = Worker::spawn_wal(&spec, format!("w{victim}.{n}"));
            bound += i64::try_from(wal_window()).unwrap();
        } else {
            restarts += 1;
            // The restart ends the active worker's session as a kill would; the
            // worker survives and resumes from the position it confirmed itself
            // (before PostgreSQL 17 the server may have gone back to an older one).
            bound += i64::try_from(wal_window()).unwrap();
            cluster.restart().await;
        }
        let published = support::published_distinct(&pool, &schema).await;
        assert!(
            published < i64::try_from(MESSAGES).unwrap(),
            "event {n} came after the drain had finished"
        );
    }
    let (p, sc) = (&pool, schema.as_str());
    let all = i64::try_from(MESSAGES).unwrap();
    support::wait_with_workers("every message published", &mut workers, || async move {
        support::published_distinct(p, sc).await >= all
    })
    .await;
    for worker in workers {
        let id = worker.id.clone();
        let status = worker.stop().await;
        assert!(status.success(), "worker {id} stopped with {status}");
    }
    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let dead = support::dead(&pool, &table).await;
    println!(
        "chaos wal: messages={MESSAGES} keys={KEYS} workers={WORKERS} kills={kills} \
         restarts={restarts} server_version={version} lost={} duplicates={} bound={bound} \
         dead={dead} elapsed={:.1?}",
        delivery.lost,
        delivery.duplicates,
        started.elapsed()
    );
    delivery.assert_within(bound);
    assert_eq!(dead, 0, "no message should be dead-lettered");
    pool.close().await;
}

/// Rows no enqueue would write, planted with SQL under running workers (unordered and
/// per key), are dead-lettered with a readable error, and the normal messages around
/// them are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_do_not_stop_delivery() {
    /// Normal messages per trial, over two keys: the poison heads the first.
    const NORMALS: usize = 6;
    /// Trials that pass settle in well under a second; a failing one waits this long.
    const TRIAL_DEADLINE: Duration = Duration::from_secs(10);
    let Some(url) = support::url("chaos: poison rows") else {
        return;
    };
    let _serial = support::serial().await;
    let started = Instant::now();
    let pool = support::connect_shared(&url, 4).await;
    let schema = support::schema_name();

    // One table and one worker per (ordering, poison kind), so one poison that stops a
    // relay cannot hide what the others do.
    let mut trials = Vec::new();
    for order in [KeyOrder::Unordered, KeyOrder::PerKey] {
        for poison in poison::kinds() {
            let prefix = if order == KeyOrder::PerKey { "k" } else { "u" };
            let table = format!("{prefix}_{}", poison.name);
            let outbox = support::install(&pool, &schema, &table, order).await;
            let spec = WorkerSpec {
                url: url.clone(),
                schema: schema.clone(),
                table: table.clone(),
                order,
                // One connection for the publisher and one for the relay's statements,
                // so 34 workers stay well under the server's 100 connections.
                pool_size: 1,
                mysql_url: None,
                dynamodb_url: None,
                held_lock: false,
                crash: None,
            };
            let worker = Worker::spawn(&spec, format!("{prefix}-{}", poison.name));
            trials.push((outbox, table, poison, order, worker));
        }
    }
    let mut planted = Vec::new();
    for (outbox, table, poison, order, worker) in trials {
        let qualified = support::qualified(&schema, &table);
        let poison_id = poison::plant(&pool, &qualified, &poison).await;
        planted.push((outbox, qualified, poison, order, worker, poison_id));
    }
    let mut trials = Vec::new();
    for (outbox, table, poison, order, worker, poison_id) in planted {
        let normals = support::enqueue_keyed(&outbox, NORMALS, 2).await;
        trials.push(Trial {
            poison,
            order,
            schema: schema.clone(),
            table,
            worker,
            poison_id,
            normals,
        });
    }

    let waiting = Instant::now();
    loop {
        let mut settled = true;
        for trial in &mut trials {
            settled &= trial.settled(&pool).await;
        }
        if settled || waiting.elapsed() > TRIAL_DEADLINE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut failed = Vec::new();
    for trial in &mut trials {
        let order = format!("{:?}", trial.order);
        match trial.verdict(&pool).await {
            Ok(what) => println!("poison ok   {order:<9} {:<20} {what}", trial.poison.name),
            Err(why) => {
                println!("poison FAIL {order:<9} {:<20} {why}", trial.poison.name);
                failed.push(format!("{order} {}: {why}", trial.poison.name));
            }
        }
    }
    let total = trials.len();
    for trial in trials {
        let _ = trial.worker.stop().await;
    }
    println!(
        "chaos poison: trials={total} failed={} elapsed={:.1?}",
        failed.len(),
        started.elapsed()
    );
    assert!(
        failed.is_empty(),
        "{} of {total} poison trials failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    support::drop_schema(&pool, &schema).await;
}

/// Four `chaos-streams-worker` processes (DynamoDB Local's stream has one shard: one
/// reads, three stand by) drain 20,000 messages while the worker reading the shard is
/// SIGKILLed ten times: nothing lost, nothing dead-lettered, and duplicates at most
/// one read (`RECORDS_PER_READ` records) per kill. The relay promises no order, so
/// none is checked. On a DynamoDB Local of the test's own: 20,000 stream records slow
/// every later write to a table with a stream on the server that holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_relay_loses_nothing_across_sigkills() {
    const MESSAGES: usize = 20_000;
    const WORKERS: usize = 4;
    const KILLS: usize = 10;
    let Some(url) = support::url("chaos on DynamoDB Streams: the published table") else {
        return;
    };
    if support::dynamodb::url("chaos on DynamoDB Streams: SIGKILLed relay workers").is_none() {
        return;
    }
    let _serial = support::serial().await;
    let local = match outbox_testkit::dynamodb_local::PrivateDynamoDbLocal::start() {
        Ok(local) => local,
        Err(why) if outbox_testkit::integration_required() => {
            panic!("cannot start a private DynamoDB Local but OUTBOX_REQUIRE_INTEGRATION=1: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: chaos on DynamoDB Streams: {why}");
            return;
        }
    };
    let dynamodb_url = local.url();
    let started = Instant::now();
    let pool = support::connect_shared(&url, 4).await;
    let schema = support::schema_name();
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{schema}\"; {}",
        outbox_chaos::published_ddl(&schema)
    ))
    .execute(&pool)
    .await
    .expect("create the published table");
    let outbox = support::streams::install(&dynamodb_url, &schema).await;
    let (messages, sent) = support::keyed_messages(MESSAGES, 50, &mut fastrand::Rng::new());
    support::streams::enqueue_all(&outbox, messages).await;
    let enqueued = started.elapsed();
    let spec = WorkerSpec {
        url: url.clone(),
        schema: schema.clone(),
        table: schema.clone(),
        order: KeyOrder::Unordered,
        pool_size: 4,
        mysql_url: None,
        dynamodb_url: Some(dynamodb_url),
        held_lock: false,
        crash: None,
    };
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|n| Worker::spawn_streams(&spec, format!("s{n}")))
        .collect();
    let all = i64::try_from(MESSAGES).unwrap();
    let step = MESSAGES / (KILLS + 2);
    let mut owners_killed = 0;
    for kill in 1..=KILLS {
        let target = i64::try_from(step * kill).unwrap();
        let (p, sc) = (&pool, schema.as_str());
        support::wait_with_workers(
            &format!("{target} messages published before kill {kill}"),
            &mut workers,
            || async move { support::published_distinct(p, sc).await >= target },
        )
        .await;
        // The worker reading the shard: killing a standby would prove nothing.
        let owners = support::streams::owners(&outbox).await;
        let victim = workers
            .iter()
            .position(|w| support::streams::owner_id(w).is_some_and(|id| owners.contains(&id)))
            .unwrap_or_else(|| fastrand::usize(..WORKERS));
        if support::streams::owner_id(&workers[victim]).is_some_and(|id| owners.contains(&id)) {
            owners_killed += 1;
        }
        workers[victim].kill().await;
        let published = support::published_distinct(&pool, &schema).await;
        assert!(
            published < all,
            "kill {kill} came after the drain had finished"
        );
        workers[victim] = Worker::spawn_streams(&spec, format!("s{victim}.{kill}"));
    }
    let (p, sc) = (&pool, schema.as_str());
    support::wait_with_workers("every message published", &mut workers, || async move {
        support::published_distinct(p, sc).await >= all
    })
    .await;
    for worker in workers {
        let id = worker.id.clone();
        let status = worker.stop().await;
        assert!(status.success(), "worker {id} stopped with {status}");
    }
    let delivery = support::check_delivery(&pool, &schema, &sent).await;
    let dead = outbox
        .dead_letters(10)
        .await
        .expect("read the dead letters");
    let bound = i64::try_from(KILLS).unwrap() * i64::from(outbox_chaos::streams::RECORDS_PER_READ);
    println!(
        "chaos streams: messages={MESSAGES} workers={WORKERS} kills={KILLS} \
         readers_killed={owners_killed} lost={} duplicates={} bound={bound} dead={} \
         enqueue={enqueued:.1?} elapsed={:.1?}",
        delivery.lost,
        delivery.duplicates,
        dead.len(),
        started.elapsed()
    );
    assert_eq!(delivery.lost, 0, "messages lost: {delivery:?}");
    assert_eq!(delivery.unexpected, 0, "{delivery:?}");
    assert!(
        delivery.duplicates <= bound,
        "{} duplicates exceed the bound of {bound}",
        delivery.duplicates
    );
    assert!(
        dead.is_empty(),
        "no message should be dead-lettered: {dead:?}"
    );
    assert!(
        owners_killed >= KILLS / 2,
        "only {owners_killed} kills hit the reading worker"
    );
    drop(local);
    support::drop_schema(&pool, &schema).await;
}
