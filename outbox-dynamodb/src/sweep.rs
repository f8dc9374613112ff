//! The body sweep (see `body.rs` for what it guarantees): which shards are due, the
//! background task a claim starts, and one shard's pass over its `due` index.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use outbox_core::{Error, MessageId, Result};

use crate::concurrency::bounded;
use crate::error::from_sdk;
use crate::item::{self, candidate_id, get_n, now_us, Item, AVAILABLE};
use crate::store::DynamoOutbox;

/// Most long-waiting messages one sweep step looks at; the rest wait for the next
/// step, so one step stays short.
const STEP_BUDGET: usize = 100;
/// Index entries per sweep page after the first (which reads one).
const PAGE: usize = 100;
/// The sweep looks at messages waiting longer than `body_ttl / WAITING_LONG` (see
/// `body.rs` for why a sixteenth).
pub(crate) const WAITING_LONG: u64 = 16;
/// How long a shard whose sweep failed waits before the next try (microseconds).
const RETRY_AFTER_US: u64 = 60_000_000;

/// Where a store's sweeps stand, per shard it claims from.
#[derive(Debug, Default)]
pub(crate) struct Sweeper {
    shards: std::sync::Mutex<HashMap<u16, ShardSweep>>,
    /// One sweep at a time per store.
    running: Arc<tokio::sync::Mutex<()>>,
    /// Which due shard the next step starts with: turns, so a step's budget does not
    /// always go to the same shards.
    turn: AtomicUsize,
}

#[derive(Debug, Default)]
struct ShardSweep {
    /// When the shard is next swept (microseconds; 0: at once).
    next_at: u64,
    /// Where an unfinished pass goes on.
    resume: Option<Item>,
    /// When the current pass began (microseconds).
    began: u64,
    /// When the last completed pass began (microseconds).
    swept: Option<u64>,
    /// How long the oldest due message had waited when the last pass began
    /// (microseconds).
    oldest_due_age_us: Option<u64>,
}

/// What one shard's sweep came to.
#[derive(Debug, Default)]
struct Pass {
    renewed: u64,
    /// The first message whose renewal failed (the pass went on).
    failed: Option<Error>,
}

impl Sweeper {
    fn shards(&self) -> std::sync::MutexGuard<'_, HashMap<u16, ShardSweep>> {
        self.shards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl DynamoOutbox {
    /// Sweep the shards this store claims from for messages whose bodies need their
    /// time to live renewed, now, whatever the schedule (claims start a sweep on their
    /// own every [`body_sweep_every`](crate::DynamoOutboxConfig::with_body_sweep_every);
    /// see the crate docs, "Bodies of undelivered messages are renewed"). Reads the
    /// `due` index of each shard (with shard leases, those this store holds after a
    /// maintenance round), the state item of every undelivered message waiting longer
    /// than a sixteenth of `body_ttl`, and renews the bodies with less than half of
    /// `body_ttl` left, within the store's
    /// [renewal budget](crate::DynamoOutboxConfig::with_renewal_budget). Useful from a maintenance job while relays are stopped for long
    /// (with shard leases, this store takes the lapsed leases of the stopped relays;
    /// call [`release_shards`](Self::release_shards) after). Waits for a sweep a claim
    /// started to finish first. Returns how many bodies were renewed.
    ///
    /// # Errors
    /// The first mapped SDK error, after every shard and message was tried; bodies
    /// renewed stay renewed.
    pub async fn renew_bodies(&self) -> Result<u64> {
        let shards = match self.claim_shards().await {
            Ok(shards) => shards,
            Err(e) => {
                self.count_sweep_error();
                return Err(e);
            }
        };
        let _guard = self.inner.sweep.running.lock().await;
        let mut renewed = 0;
        let mut failed = None;
        for shard in shards {
            if let Some(sweep) = self.inner.sweep.shards().get_mut(&shard) {
                sweep.resume = None;
            }
            let mut budget = usize::MAX;
            match self.sweep_shard(shard, &mut budget).await {
                Ok(pass) => {
                    renewed += pass.renewed;
                    failed = failed.or(pass.failed);
                }
                Err(e) => {
                    self.count_sweep_error();
                    failed = failed.or(Some(e));
                }
            }
        }
        self.publish_sweep_gauge();
        match failed {
            Some(e) => Err(e),
            None => Ok(renewed),
        }
    }

    /// From a claim: when a shard of `shards` is due for a sweep and no sweep of this
    /// store is running, start one in the background (on a clone of the store). Never
    /// waits: the claim goes on at once.
    pub(crate) fn start_sweep(&self, shards: &[u16]) {
        let now = now_us();
        let due: Vec<u16> = {
            let mut map = self.inner.sweep.shards();
            map.retain(|shard, _| shards.contains(shard));
            shards
                .iter()
                .copied()
                .filter(|shard| map.get(shard).is_none_or(|s| s.next_at <= now))
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(guard) = Arc::clone(&self.inner.sweep.running).try_lock_owned() else {
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            store.sweep_step(due).await;
            drop(guard);
        });
    }

    /// One step of the sweep: the shards of `due` (starting with a different one each
    /// step), until [`STEP_BUDGET`] long-waiting messages were looked at. An error is
    /// logged and counted, and the shard tried again a minute later.
    async fn sweep_step(&self, mut due: Vec<u16>) {
        let turn = self.inner.sweep.turn.fetch_add(1, Ordering::Relaxed);
        let len = due.len().max(1);
        due.rotate_left(turn % len);
        let mut budget = STEP_BUDGET;
        for shard in due {
            if budget == 0 {
                break;
            }
            if let Err(e) = self.sweep_shard(shard, &mut budget).await {
                self.count_sweep_error();
                tracing::warn!(shard, error = %e.report(), "body sweep failed; the shard is tried again in a minute");
                let mut map = self.inner.sweep.shards();
                map.entry(shard).or_default().next_at = now_us().saturating_add(RETRY_AFTER_US);
            }
        }
        self.publish_sweep_gauge();
    }

    fn count_sweep_error(&self) {
        self.inner
            .metrics
            .sweep_errors
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Walk shard `shard`'s due entries oldest first (going on from an unfinished
    /// pass), renewing what needs it, until the entries are younger than a sixteenth
    /// of `body_ttl` or `budget` messages were looked at. A message whose renewal fails is
    /// logged, counted and passed; a failed index query keeps the pass's position.
    async fn sweep_shard(&self, shard: u16, budget: &mut usize) -> Result<Pass> {
        let now = now_us();
        let cutoff = now.saturating_sub(self.body_ttl_us() / WAITING_LONG);
        let mut start = {
            let mut map = self.inner.sweep.shards();
            let sweep = map.entry(shard).or_default();
            let start = sweep.resume.take();
            if start.is_none() {
                sweep.began = now;
            }
            start
        };
        let mut first = start.is_none();
        let mut pass = Pass::default();
        loop {
            let limit = if first { 1 } else { (*budget).clamp(1, PAGE) };
            let sent = self
                .due_query(shard, now)
                .limit(i32::try_from(limit).unwrap_or(1))
                .set_exclusive_start_key(start.clone())
                .send()
                .await;
            let out = match sent {
                Ok(out) => out,
                Err(e) => {
                    self.inner.sweep.shards().entry(shard).or_default().resume = start;
                    return Err(from_sdk("body sweep", e));
                }
            };
            self.record_capacity(&self.inner.metrics.renewal_units, out.consumed_capacity());
            let entries = out.items.unwrap_or_default();
            let next = out.last_evaluated_key.filter(|k| !k.is_empty());
            if first {
                let oldest = entries
                    .first()
                    .and_then(|e| get_n::<u64>(e, AVAILABLE).ok().flatten())
                    .map(|a| now.saturating_sub(a));
                self.inner
                    .sweep
                    .shards()
                    .entry(shard)
                    .or_default()
                    .oldest_due_age_us = oldest;
                first = false;
            }
            let mut ids = Vec::new();
            let mut passed = false;
            for entry in &entries {
                // An entry without a valid availability is looked at: the state read
                // decides.
                let available = get_n::<u64>(entry, AVAILABLE).ok().flatten();
                if available.is_some_and(|a| a >= cutoff) {
                    passed = true;
                    break;
                }
                ids.extend(candidate_id(entry));
            }
            *budget = budget.saturating_sub(ids.len());
            let looked: Vec<std::result::Result<bool, (MessageId, Error)>> = bounded(
                ids.into_iter()
                    .map(|id| async move {
                        Ok(self.renew_if_expiring(id, now).await.map_err(|e| (id, e)))
                    })
                    .collect(),
            )
            .await?;
            for outcome in looked {
                match outcome {
                    Ok(renewed) => pass.renewed += u64::from(renewed),
                    Err((id, e)) => {
                        self.count_sweep_error();
                        tracing::warn!(%id, error = %e.report(), "body not renewed; the next pass looks again");
                        pass.failed = pass.failed.or(Some(e));
                    }
                }
            }
            let mut map = self.inner.sweep.shards();
            let sweep = map.entry(shard).or_default();
            match next {
                Some(key) if !passed && *budget > 0 => start = Some(key),
                Some(key) if !passed => {
                    sweep.resume = Some(key);
                    return Ok(pass);
                }
                _ => {
                    let every = item::duration_us(self.inner.config.body_sweep_every());
                    sweep.next_at = now_us().saturating_add(every);
                    sweep.resume = None;
                    sweep.swept = Some(sweep.began);
                    return Ok(pass);
                }
            }
        }
    }

    /// Publish the gauges of the sweeps: the longest wait of an oldest due message over
    /// the shards swept (as of each shard's last pass), and when the stalest of them
    /// last completed a pass (none until every one has).
    fn publish_sweep_gauge(&self) {
        let (oldest, swept) = {
            let map = self.inner.sweep.shards();
            let oldest = map.values().filter_map(|s| s.oldest_due_age_us).max();
            let swept = map.values().map(|s| s.swept).min().flatten();
            (oldest, swept)
        };
        let metrics = &self.inner.metrics;
        // 0 stands for none.
        let stored = oldest.map_or(0, |age| age.saturating_add(1));
        metrics.oldest_due_age_us.store(stored, Ordering::Relaxed);
        metrics
            .swept_us
            .store(swept.unwrap_or(0), Ordering::Relaxed);
    }
}
