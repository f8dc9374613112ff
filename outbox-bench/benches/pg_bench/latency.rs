//! Scenario 3: commit-to-publish latency at a steady offered rate.
//!
//! One producer schedules a transaction every `1 / rate` (open loop: a late commit does
//! not delay the next one, so slow commits cannot hide latency). Each transaction
//! enqueues one message and commits; the producer notes the instant `COMMIT` returned.
//! A relay with a recording publisher notes the instant each message reached it. The
//! latency is the difference, both read from one monotonic clock in one process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{Message, MessageId, PublishOutcome, Publisher, Relay, RelayConfig};
use outbox_postgres::{spawn_listener, Notify, PgOutbox, PgOutboxConfig};

use crate::harness::{ms, order_message, Env, Percentiles, Res, Table};

const SCHEMA: &str = "obx_bench_latency";
/// Offered rate, messages (and transactions) per second.
const RATE: u32 = 1_000;
/// Transactions in flight at most: the producer's pool.
const PRODUCER_CONNECTIONS: u32 = 16;
/// The fixed poll interval of the polling-only mode.
const POLL: Duration = Duration::from_millis(100);
/// Messages enqueued in the first this-long are not counted.
const WARM_UP: Duration = Duration::from_millis(500);

/// Records when each message reached the broker.
#[derive(Debug, Default)]
struct Stopwatch {
    seen: Mutex<Vec<(MessageId, Instant)>>,
}

#[async_trait]
impl Publisher for Stopwatch {
    async fn publish(&self, batch: &[Message]) -> outbox_core::Result<Vec<PublishOutcome>> {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(batch.iter().map(|m| (m.id, now)));
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

impl Stopwatch {
    fn count(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One committed message: when it was due to be sent and when its commit returned.
#[derive(Debug, Clone, Copy)]
struct Commit {
    id: MessageId,
    scheduled: Instant,
    committed: Instant,
}

/// Run the scenario; returns its JSON results.
pub(crate) async fn run(env: &Env) -> Res<serde_json::Value> {
    let length = env
        .mode
        .pick(Duration::from_secs(10), Duration::from_secs(2));
    env.heading(
        "3. Commit-to-publish latency",
        &format!(
            "one open-loop producer offering {RATE} msg/s for {length:?} (1 message per \
             transaction, up to {PRODUCER_CONNECTIONS} in flight), relay with defaults \
             (batch 100); latency = publisher receive - producer's COMMIT return; first \
             {WARM_UP:?} not counted. NOTIFY: listener wakes the relay (poll 100 ms..5 s as \
             fallback). Polling: NOTIFY off, poll interval fixed at {POLL:?}"
        ),
    );
    let admin = env.pool(2).await?;
    let notify = PgOutboxConfig::default()
        .with_schema(SCHEMA)
        .with_table("outbox_notify")
        .with_notify(Notify::OnCommit);
    let polling = PgOutboxConfig::default()
        .with_schema(SCHEMA)
        .with_table("outbox_polling")
        .with_notify(Notify::Off);

    let mut table = Table::new(&[
        "mode",
        "offered/s",
        "committed/s",
        "samples",
        "p50 ms",
        "p99 ms",
        "max ms",
        "commit p99 ms",
        "target",
    ]);
    let mut rows = Vec::new();
    for (name, config) in [("NOTIFY wake-up", notify), ("polling only", polling)] {
        let outbox = PgOutbox::new(admin.clone(), config)?;
        outbox.install().await?;
        let run = measure(env, &outbox, length).await?;
        let target = if outbox.config().notify_channel().is_some() {
            "p50 < 5, p99 < 20"
        } else {
            ""
        };
        let (p50, p99, max) = run.lag.map_or(("-".into(), "-".into(), "-".into()), |p| {
            (
                format!("{:.2}", ms(p.p50)),
                format!("{:.2}", ms(p.p99)),
                format!("{:.2}", ms(p.max)),
            )
        });
        table.row(vec![
            name.to_owned(),
            RATE.to_string(),
            format!("{:.0}", run.committed_rate),
            run.lag.map_or(0, |p| p.count).to_string(),
            p50,
            p99,
            max,
            run.commit
                .map_or("-".into(), |p| format!("{:.2}", ms(p.p99))),
            target.to_owned(),
        ]);
        rows.push(serde_json::json!({
            "mode": name,
            "offered_per_s": RATE,
            "committed_per_s": run.committed_rate,
            "commit_to_publish": run.lag.map(|p| p.json()),
            "schedule_to_commit": run.commit.map(|p| p.json()),
        }));
    }
    table.print();
    println!(
        "commit p99 = scheduled send -> COMMIT returned (the producer's own latency); a \
         committed/s below offered/s means the server could not take the offered rate"
    );
    admin.close().await;
    Ok(serde_json::json!({
        "description": "commit-to-publish latency at a steady offered rate",
        "seconds": length.as_secs_f64(),
        "poll_interval_ms_polling_mode": ms(POLL),
        "rows": rows,
    }))
}

struct Measured {
    committed_rate: f64,
    lag: Option<Percentiles>,
    commit: Option<Percentiles>,
}

async fn measure(env: &Env, outbox: &PgOutbox, length: Duration) -> Res<Measured> {
    let relay_pool = env.pool(4).await?;
    let store = Arc::new(PgOutbox::new(relay_pool.clone(), outbox.config().clone())?);
    let stopwatch = Arc::new(Stopwatch::default());
    let channel = outbox.config().notify_channel();
    let config = match channel {
        Some(_) => RelayConfig::default(),
        None => RelayConfig::default()
            .with_poll_interval(POLL)
            .with_max_poll_interval(POLL),
    };
    let relay = Relay::new(store, stopwatch.clone(), config.with_name("latency"))?;
    let listener = channel
        .map(|channel| spawn_listener(relay_pool.clone(), channel, relay.wakeup()))
        .transpose()?;
    let running = relay.spawn();
    relay.wait_idle(Duration::from_secs(10)).await?;

    let commits = produce(env, outbox, length).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while stopwatch.count() < commits.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await?;
    if let Some(listener) = listener {
        listener.stop().await;
    }
    relay_pool.close().await;

    let seen: HashMap<MessageId, Instant> = stopwatch
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect();
    let start = commits
        .iter()
        .map(|c| c.scheduled)
        .min()
        .ok_or("no commits")?;
    let end = commits
        .iter()
        .map(|c| c.committed)
        .max()
        .ok_or("no commits")?;
    let counted: Vec<&Commit> = commits
        .iter()
        .filter(|c| c.scheduled >= start + WARM_UP)
        .collect();
    let lag: Vec<Duration> = counted
        .iter()
        .filter_map(|c| Some(seen.get(&c.id)?.saturating_duration_since(c.committed)))
        .collect();
    if lag.len() < counted.len() {
        let missing = counted.len() - lag.len();
        return Err(format!("{missing} committed messages were not published within 30 s").into());
    }
    let commit = counted
        .iter()
        .map(|c| c.committed.saturating_duration_since(c.scheduled))
        .collect();
    Ok(Measured {
        committed_rate: commits.len() as f64 / (end - start).as_secs_f64(),
        lag: Percentiles::of(lag),
        commit: Percentiles::of(commit),
    })
}

/// Offer `RATE` transactions per second for `length`; returns every commit.
async fn produce(env: &Env, outbox: &PgOutbox, length: Duration) -> Res<Vec<Commit>> {
    let pool = env.pool(PRODUCER_CONNECTIONS).await?;
    let total = u64::try_from(length.as_millis())? * u64::from(RATE) / 1_000;
    let interval = Duration::from_secs(1) / RATE;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..total {
        let scheduled = start + interval * u32::try_from(i)?;
        tokio::time::sleep_until(scheduled.into()).await;
        let pool = pool.clone();
        let outbox = outbox.clone();
        tasks.push(tokio::spawn(async move {
            let message = order_message(i)?;
            let id = message.id();
            let mut tx = pool.begin().await?;
            outbox.enqueue(&mut tx, &[message]).await?;
            tx.commit().await?;
            Res::Ok(Commit {
                id,
                scheduled,
                committed: Instant::now(),
            })
        }));
    }
    let mut commits = Vec::with_capacity(tasks.len());
    for task in tasks {
        commits.push(task.await??);
    }
    pool.close().await;
    Ok(commits)
}
