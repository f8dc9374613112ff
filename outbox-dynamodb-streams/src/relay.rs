//! [`StreamRelay`]: shard leases taken and renewed, a reader per owned shard, shards
//! found and finished as the stream splits them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::Backoff;
use outbox_core::relay::PublishStage;
use outbox_core::{Error, ErrorKind, Publisher, Result};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::StreamRelayConfig;
use crate::item::now_us;
use crate::leases::LeaseTable;
use crate::lineage::{self, Take};
use crate::meters::Meters;
use crate::outbox::StreamOutbox;
use crate::reader::{read_shard, Counts, Held, ReaderEnd, Shared};
use crate::stream;

/// What a [`StreamRelay::run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamRelayReport {
    /// Messages the broker accepted (repeats after a takeover count again).
    pub published: u64,
    /// Messages written to the dead letters.
    pub dead_lettered: u64,
    /// Retryable publish failures (each counts as an attempt of its message).
    pub retried: u64,
    /// Publisher panics caught.
    pub panics: u64,
    /// Stream records read.
    pub records_read: u64,
    /// Shards this relay read to their end.
    pub shards_finished: u64,
    /// Shard leases this relay took.
    pub leases_taken: u64,
    /// Shard leases this relay lost to another worker.
    pub leases_lost: u64,
}

/// The log-tailing relay for a [`StreamOutbox`]: reads the message table's stream and
/// publishes every message item inserted, with no claim and no index.
///
/// # Protocol
///
/// Every third of the [`lease`](StreamRelayConfig::lease) the relay (a *worker*, with
/// a random id) runs a round over the lease table:
///
/// 1. writes its heartbeat;
/// 2. every [`discovery_interval`](StreamRelayConfig::discovery_interval), and at once
///    after one of its shards ended, lists the stream's shards (`DescribeStream`) and
///    creates a lease for each new one (conditional: one lease per shard, whoever
///    finds it first); leases of finished shards the stream no longer lists are
///    deleted;
/// 3. renews its leases, each conditional on its `owner` and `counter`: a lease
///    another worker took is dropped and its reader stopped;
/// 4. takes leases of *readable* shards (not finished, and whose parent was read to
///    its end: see lineage in the crate docs) up to ⌈readable ÷ live workers⌉, free and
///    lapsed ones first, then one stolen per round from the worker holding the most.
///
/// A reader per owned shard opens an iterator after the lease's checkpoint (at the
/// shard's oldest record when there is none) and loops on `GetRecords`:
///
/// - `INSERT` records of a message's first item are decoded (a split message's other
///   parts read from the table); everything else (later parts, TTL removals, dead
///   letters) is skipped;
/// - the messages are published in calls of
///   [`batch_size`](StreamRelayConfig::batch_size), up to
///   [`publish_concurrency`](StreamRelayConfig::publish_concurrency) at once, through
///   the guards the polling relay uses ([`PublishStage`]); a message refused
///   retryably is published again after the [`retry`](StreamRelayConfig::retry)
///   policy's delay, and after `max_attempts`, or at a permanent refusal, written to
///   the dead letters; a message item that does not decode is dead-lettered unread;
/// - then the checkpoint moves to the last record read, conditional on the lease:
///   after a read that held messages at once, otherwise at most every
///   [`idle_checkpoint`](StreamRelayConfig::idle_checkpoint);
/// - an empty read waits [`poll_interval`](StreamRelayConfig::poll_interval); an
///   expired iterator is opened again at the position; a shard's end is checkpointed
///   as `SHARD_END`, which frees its children;
/// - a `TrimmedDataAccessException` (the records after the checkpoint are past the
///   stream's 24-hour retention) marks the lease trimmed and stops the relay with a
///   permanent [`ErrorKind::Storage`] error: see
///   [`recover_trimmed`](Self::recover_trimmed).
///
/// Shutdown stops the readers after their publish in flight, checkpoints what they
/// published, gives the leases up and removes the heartbeat, so other workers take the
/// shards at their next round.
///
/// ## Duplicates
///
/// A worker killed, or one whose lease is taken while it publishes, has published
/// messages after its last checkpoint: the next owner publishes them again, at most
/// one read ([`records_per_read`](StreamRelayConfig::records_per_read) records) per
/// shard. Publishers pass the message id as the broker's dedup id; consumers
/// deduplicate.
///
/// ## Ordering
///
/// DynamoDB Streams orders the records of one item; every message is an item of its
/// own, and the calls of one read overlap, so this relay promises **no order**, not
/// even per partition key. Use the polling `DynamoOutbox` with `KeyOrder::PerKey`
/// where order matters.
#[derive(Debug)]
pub struct StreamRelay {
    shared: Arc<Shared>,
    worker: String,
}

impl StreamRelay {
    /// A relay reading `outbox`'s stream with `streams` (a DynamoDB Streams client for
    /// the same region and credentials as the outbox's client), publishing to
    /// `publisher`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an invalid config.
    pub fn new(
        outbox: StreamOutbox,
        streams: aws_sdk_dynamodbstreams::Client,
        publisher: Arc<dyn Publisher>,
        config: StreamRelayConfig,
    ) -> Result<Self> {
        config.validate()?;
        let stage = PublishStage::new(publisher, &config.name, config.publish_timeout);
        Ok(StreamRelay {
            worker: uuid::Uuid::new_v4().simple().to_string(),
            shared: Arc::new(Shared {
                outbox,
                streams,
                stage,
                meters: Meters::new(&config.name),
                config,
                counts: Counts::default(),
            }),
        })
    }

    /// This worker's id in the lease table.
    pub fn worker_id(&self) -> &str {
        &self.worker
    }

    fn report(&self) -> StreamRelayReport {
        let c = &self.shared.counts;
        let get = |slot: &std::sync::atomic::AtomicU64| slot.load(Ordering::Relaxed);
        StreamRelayReport {
            published: get(&c.published),
            dead_lettered: get(&c.dead_lettered),
            retried: get(&c.retried),
            panics: get(&c.panics),
            records_read: get(&c.records_read),
            shards_finished: get(&c.shards_finished),
            leases_taken: 0,
            leases_lost: 0,
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The lease table of the outbox's current stream, as this worker.
    pub(crate) async fn lease_table(&self) -> Result<LeaseTable> {
        let outbox = &self.shared.outbox;
        Ok(LeaseTable::new(
            outbox.client().clone(),
            outbox.config().lease_table(),
            outbox.stream_arn().await?,
            self.worker.clone(),
            self.shared.config.lease,
            Arc::clone(outbox.capacity()),
        ))
    }

    /// Run until `shutdown` is cancelled (returning what was done) or a permanent
    /// failure.
    ///
    /// # Errors
    /// A trimmed stream (see [`recover_trimmed`](Self::recover_trimmed)), a missing
    /// table or stream, refused credentials, or another permanent error.
    pub async fn run(self, shutdown: CancellationToken) -> Result<StreamRelayReport> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let leases = loop {
            match self.lease_table().await {
                Ok(leases) => break leases,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e.report(), "stream relay: reading the stream failed");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(self.report()),
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let mut run = Run {
            relay: &self,
            leases,
            held: BTreeMap::new(),
            readers: JoinSet::new(),
            listed: HashSet::new(),
            discovered: None,
            taken: 0,
            lost: 0,
        };
        let every = self.shared.config.lease / 3;
        let failure = 'run: loop {
            let pause = match run.round().await {
                Ok(()) => every,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e.report(), "stream relay: lease round failed");
                    every / 4
                }
                Err(e) => break 'run Some(e),
            };
            let deadline = Instant::now() + pause;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break 'run None,
                    () = tokio::time::sleep_until(deadline) => break,
                    Some(joined) = run.readers.join_next(), if !run.readers.is_empty() => {
                        match run.reader_ended(joined) {
                            Ok(true) => break,
                            Ok(false) => {}
                            Err(e) => break 'run Some(e),
                        }
                    }
                }
            }
        };
        run.stop().await;
        let mut report = self.report();
        report.leases_taken = run.taken;
        report.leases_lost = run.lost;
        match failure {
            Some(e) => {
                tracing::error!(error = %e.report(), "stream relay: stopping");
                Err(e)
            }
            None => Ok(report),
        }
    }
}

/// One run's state.
struct Run<'a> {
    relay: &'a StreamRelay,
    leases: LeaseTable,
    /// Shard → (counter, its reader's stop token).
    held: BTreeMap<String, (u64, CancellationToken)>,
    readers: JoinSet<(String, Result<ReaderEnd>)>,
    listed: HashSet<String>,
    discovered: Option<Instant>,
    taken: u64,
    lost: u64,
}

impl Run<'_> {
    fn config(&self) -> &StreamRelayConfig {
        &self.relay.shared.config
    }

    /// One lease round; see the protocol.
    async fn round(&mut self) -> Result<()> {
        self.leases.heartbeat().await?;
        let due = self
            .discovered
            .is_none_or(|at| at.elapsed() >= self.config().discovery_interval);
        let mut view = self.leases.read().await?;
        if due {
            let shards =
                stream::list_shards(&self.relay.shared.streams, self.leases.stream()).await?;
            self.listed = shards.iter().map(|s| s.id.clone()).collect();
            let mut created = false;
            for shard in shards.iter().filter(|s| !view.leases.contains_key(&s.id)) {
                self.leases
                    .create(&shard.id, shard.parent.as_deref())
                    .await?;
                created = true;
            }
            for lease in view.leases.values() {
                if lease.position == lineage::Position::End && !self.listed.contains(&lease.shard) {
                    self.leases.delete_finished(&lease.shard).await?;
                }
            }
            self.discovered = Some(Instant::now());
            if created {
                view = self.leases.read().await?;
            }
        }
        let mine: Vec<(String, u64)> = self
            .held
            .iter()
            .map(|(s, (c, _))| (s.clone(), *c))
            .collect();
        for (shard, counter) in mine {
            if !self.leases.renew(&shard, counter).await? {
                tracing::info!(
                    shard,
                    "stream relay: a shard lease was taken by another worker"
                );
                if let Some((_, stop)) = self.held.remove(&shard) {
                    stop.cancel();
                }
                self.lost += 1;
            }
        }
        let readable = lineage::readable(&self.listed, &view.leases);
        let held: BTreeSet<String> = self.held.keys().cloned().collect();
        let takes: Vec<Take> = lineage::plan(
            self.leases.me(),
            now_us(),
            view.live_workers.max(1),
            &readable,
            &held,
        );
        for take in takes {
            let Some(taken) = self.leases.take(&take).await? else {
                continue;
            };
            let (counter, position) = (taken.counter, taken.position);
            tracing::info!(
                shard = take.shard,
                stolen = take.from.is_some(),
                "stream relay: took a shard lease"
            );
            self.taken += 1;
            let stop = CancellationToken::new();
            self.held
                .insert(take.shard.clone(), (counter, stop.clone()));
            let shared = Arc::clone(&self.relay.shared);
            let leases = self.leases.clone();
            let held = Held {
                shard: take.shard.clone(),
                counter,
                position,
            };
            self.readers.spawn(async move {
                let shard = held.shard.clone();
                (shard, read_shard(shared, leases, held, stop).await)
            });
        }
        #[allow(clippy::cast_precision_loss)] // a gauge
        self.relay
            .shared
            .meters
            .shards_owned
            .set(self.held.len() as f64);
        Ok(())
    }

    /// A reader ended: `Ok(true)` to run a round at once (a shard ended: its children
    /// are readable), `Err` to stop the relay.
    fn reader_ended(
        &mut self,
        joined: std::result::Result<(String, Result<ReaderEnd>), tokio::task::JoinError>,
    ) -> Result<bool> {
        let (shard, ended) = joined.map_err(|e| {
            Error::new(ErrorKind::Storage, format!("a shard reader failed: {e}"))
                .with_status(outbox_core::ErrorStatus::Permanent)
        })?;
        let was_held = self.held.remove(&shard);
        #[allow(clippy::cast_precision_loss)] // a gauge
        self.relay
            .shared
            .meters
            .shards_owned
            .set(self.held.len() as f64);
        match ended? {
            ReaderEnd::Finished => {
                self.discovered = None;
                Ok(true)
            }
            ReaderEnd::Lost => {
                if was_held.is_some() {
                    self.lost += 1;
                }
                Ok(false)
            }
            ReaderEnd::Stopped => Ok(false),
            ReaderEnd::Trimmed(e) => Err(e),
        }
    }

    /// Stop every reader, give the leases up, remove the heartbeat.
    async fn stop(&mut self) {
        for (_, stop) in self.held.values() {
            stop.cancel();
        }
        while let Some(joined) = self.readers.join_next().await {
            let Ok((shard, ended)) = &joined else {
                continue;
            };
            let Some((counter, _)) = self.held.remove(shard) else {
                continue;
            };
            match ended {
                Ok(ReaderEnd::Stopped) => {
                    if let Err(e) = self.leases.release(shard, counter).await {
                        tracing::debug!(error = %e.report(), shard, "stream relay: releasing a lease failed");
                    }
                }
                Ok(ReaderEnd::Lost) => self.lost += 1,
                _ => {}
            }
        }
        self.leases.remove_heartbeat().await;
        self.relay.shared.meters.shards_owned.set(0.0);
    }
}
