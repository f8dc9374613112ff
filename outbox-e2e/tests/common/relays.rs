//! Relays that crash on cue: the real publisher with a crash plan listening in, and a
//! supervisor that aborts a whole generation of relays when the plan fires and starts
//! the next.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::{
    Message, OutboxStore, PublishOutcome, Publisher, Relay, RelayConfig, RelayHandle, Result,
    Wakeup,
};
use outbox_postgres::PgOutbox;
use outbox_testkit::wait::within;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ok;

/// Relays running at once; a crash takes all of them (one process).
pub const RELAYS: usize = 2;
/// Messages per relay claim: the most one relay holds when it crashes.
pub const BATCH: usize = 50;
/// The relays crash after every this many confirmed publishes ...
const CRASH_EVERY: u64 = 300;
/// ... this many times (the last at 1,800, before the producer is done).
pub const CRASHES: u64 = 6;
/// Short, so a crashed relay's messages are published again within two seconds.
const LEASE: Duration = Duration::from_secs(2);
/// The relay's bound on one publish call; the publishers' own timeouts are shorter.
const RELAY_PUBLISH_TIMEOUT: Duration = Duration::from_millis(1_500);

/// Wakes the relays running now (a relay has a wake-up handle of its own, so the
/// producer needs each generation's).
#[derive(Debug, Clone, Default)]
pub struct Wakeups(Arc<Mutex<Vec<Wakeup>>>);

impl Wakeups {
    pub(super) fn wake(&self) {
        let current = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for wakeup in current {
            wakeup.wake();
        }
    }

    fn replace(&self, wakeups: Vec<Wakeup>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = wakeups;
    }
}

/// When the relays crash: after every [`CRASH_EVERY`] messages the broker confirmed,
/// [`CRASHES`] times. The publish call that crosses the mark returns to no one: the
/// broker holds its batch, the relay never completes it, and the supervisor aborts
/// every relay. The batch is published again once its lease lapses.
#[derive(Debug)]
struct CrashPlan {
    /// Messages confirmed by the broker and crashes so far.
    state: Mutex<(u64, u64)>,
    published: watch::Sender<u64>,
    crash: mpsc::UnboundedSender<()>,
}

impl CrashPlan {
    /// Count `confirmed` messages; whether this call is the one to crash in.
    fn confirmed(&self, confirmed: u64) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (before, crashes) = *state;
        let after = before + confirmed;
        let crash = crashes < CRASHES && after / CRASH_EVERY > before / CRASH_EVERY;
        *state = (after, crashes + u64::from(crash));
        drop(state);
        self.published.send_replace(after);
        if crash {
            let _ = self.crash.send(());
        }
        crash
    }
}

/// The relay's publisher: the real one, with the crash plan listening in.
#[derive(Debug)]
struct Crashing {
    inner: Arc<dyn Publisher>,
    plan: Arc<CrashPlan>,
}

#[async_trait]
impl Publisher for Crashing {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let outcomes = self.inner.publish(batch).await?;
        let confirmed = outcomes
            .iter()
            .filter(|o| **o == PublishOutcome::Published)
            .count();
        if self.plan.confirmed(confirmed as u64) {
            // The broker has the batch; the relay dies before it hears so.
            std::future::pending::<()>().await;
        }
        Ok(outcomes)
    }
}

/// Connects a new publisher for the relay named by the argument (each relay of each
/// generation gets its own connection, as a restarted process would).
pub type Connect = Arc<dyn Fn(String) -> BoxFuture<'static, Arc<dyn Publisher>> + Send + Sync>;

/// [`RELAYS`] relays over one outbox, aborted together and replaced by a new
/// generation each time the crash plan fires.
#[derive(Debug)]
pub struct Relays {
    /// Wake-ups of the generation running now, for the producer.
    pub wakeups: Wakeups,
    /// Messages the broker confirmed so far, duplicates included.
    pub published: watch::Receiver<u64>,
    stop: CancellationToken,
    task: JoinHandle<RelayTotals>,
}

/// What the relays of every generation did.
#[derive(Debug, Default)]
pub struct RelayTotals {
    pub generations: u64,
    pub crashes: u64,
    pub dispatched: u64,
    pub retried: u64,
    pub released: u64,
    pub leases_lost: u64,
    pub dead_lettered: u64,
    pub store_errors: u64,
    pub panics: u64,
}

impl RelayTotals {
    /// The most copies the broker can have been handed beyond one per message: each
    /// crash strands what its relays held (at most a claim each), and every failed
    /// attempt, lost lease or failed settle may have reached the broker.
    pub fn duplicate_bound(&self) -> u64 {
        self.crashes * RELAYS as u64 * BATCH as u64
            + self.retried
            + self.leases_lost
            + self.store_errors * BATCH as u64
    }
}

impl fmt::Display for RelayTotals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} generations, {} crashes; completed {}, retried {}, released {}, leases lost {}, \
             dead-lettered {}, store errors {}, panics {}",
            self.generations,
            self.crashes,
            self.dispatched,
            self.retried,
            self.released,
            self.leases_lost,
            self.dead_lettered,
            self.store_errors,
            self.panics
        )
    }
}

impl Relays {
    /// Start the first generation.
    pub fn start(outbox: &PgOutbox, connect: Connect) -> Relays {
        let (crash, crashes) = mpsc::unbounded_channel();
        let (published_tx, published) = watch::channel(0);
        let plan = Arc::new(CrashPlan {
            state: Mutex::new((0, 0)),
            published: published_tx,
            crash,
        });
        let wakeups = Wakeups::default();
        let stop = CancellationToken::new();
        let supervisor = Supervisor {
            store: Arc::new(outbox.clone()),
            connect,
            plan,
            wakeups: wakeups.clone(),
            all: Vec::new(),
        };
        let task = tokio::spawn(supervisor.run(crashes, stop.clone()));
        Relays {
            wakeups,
            published,
            stop,
            task,
        }
    }

    /// Shut the running generation down gracefully and add up what every relay did.
    pub async fn stop(self) -> RelayTotals {
        self.stop.cancel();
        within("the relays to stop", self.task)
            .await
            .expect("the relay supervisor")
    }
}

struct Supervisor {
    store: Arc<dyn OutboxStore>,
    connect: Connect,
    plan: Arc<CrashPlan>,
    wakeups: Wakeups,
    /// Every relay started, for the totals.
    all: Vec<Relay>,
}

impl Supervisor {
    async fn run(
        mut self,
        mut crashes: mpsc::UnboundedReceiver<()>,
        stop: CancellationToken,
    ) -> RelayTotals {
        let mut generation = 0;
        let mut running = self.spawn(generation).await;
        let mut crashed = 0;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                Some(()) = crashes.recv() => {
                    for relay in running.drain(..) {
                        relay.abort().await;
                    }
                    crashed += 1;
                    generation += 1;
                    running = self.spawn(generation).await;
                }
            }
        }
        for relay in running {
            ok("relay shutdown", relay.shutdown().await);
        }
        let mut totals = RelayTotals {
            generations: generation + 1,
            crashes: crashed,
            ..RelayTotals::default()
        };
        for relay in &self.all {
            let r = relay.report();
            totals.dispatched += r.dispatched;
            totals.retried += r.retried;
            totals.released += r.released;
            totals.leases_lost += r.leases_lost;
            totals.dead_lettered += r.dead_lettered;
            totals.store_errors += r.store_errors;
            totals.panics += r.panics;
        }
        totals
    }

    async fn spawn(&mut self, generation: u64) -> Vec<RelayHandle> {
        let mut handles = Vec::new();
        for i in 0..RELAYS {
            let name = format!("e2e-g{generation}-r{i}");
            let publisher = Arc::new(Crashing {
                inner: (self.connect)(name.clone()).await,
                plan: self.plan.clone(),
            });
            let config = RelayConfig::default()
                .with_name(name)
                .with_batch_size(BATCH)
                .with_publish_batch_size(BATCH / 2)
                .with_publish_concurrency(2)
                .with_lease(LEASE)
                .with_publish_timeout(RELAY_PUBLISH_TIMEOUT)
                .with_poll_interval(Duration::from_millis(5))
                .with_max_poll_interval(Duration::from_millis(50))
                .with_shutdown_grace(Duration::from_secs(1));
            let relay = ok(
                "relay config",
                Relay::new(self.store.clone(), publisher, config),
            );
            self.all.push(relay.clone());
            handles.push(relay.spawn());
        }
        self.wakeups
            .replace(handles.iter().map(|h| h.relay().wakeup()).collect());
        handles
    }
}
