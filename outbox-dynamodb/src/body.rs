//! Bodies: reading a message's body items, and keeping the bodies of undelivered
//! messages alive.
//!
//! Body items expire by DynamoDB's time to live (`ttl`, epoch seconds), so a message
//! that waits long must have it pushed out before it passes. With `T` =
//! [`body_ttl`](crate::DynamoOutboxConfig::with_body_ttl):
//!
//! 1. **Headroom.** Every write that sets a message's availability keeps its body's
//!    expiry at least `3T/4` past that availability: enqueue and requeue write
//!    availability + `T`; a claim (availability = lease expiry), a retry (the backoff's
//!    end) and a release that find less left renew it to availability + `T`.
//! 2. **Sweep.** Every [`body_sweep_every`](crate::DynamoOutboxConfig::with_body_sweep_every)
//!    (default `T/8`, at most `T/4`), a claim starts a background task (one at a time
//!    per store; the claim does not wait for it) that walks the `due` index of each
//!    shard the store claims from, oldest first: the first entry (one read) gives how
//!    long the oldest due message waited (the
//!    [`oldest_due_age`](crate::OutboxMetrics::oldest_due_age) gauge); entries whose
//!    availability is more than `T/4` old are the messages waiting long (blocked
//!    behind their key's head, a backlog far behind, put back by a release or
//!    requeue), normally none. For each, the state item is read (eventually
//!    consistent: `body_exp` only grows while the message is undelivered, so a stale
//!    read costs at most a refused write); if it is still undelivered and its
//!    `body_exp` is less than `T/2` away, the body items' `ttl` is set to now + `T`
//!    and then `body_exp` too. A message whose renewal fails is logged and counted
//!    ([`body_sweep_errors`](crate::OutboxMetrics::body_sweep_errors)) and the pass goes
//!    on; a shard whose index query fails is tried again a minute later, from where
//!    its pass stood.
//!
//! A message not yet waiting `T/4` has at least `3T/4 − T/4 = T/2` of body left, and
//! one a sweep looked at and left alone has at least `T/2` left then; so while sweeps
//! run every interval `S` (at most `T/4`) no body expires. When sweeps stop, the last
//! one ran at most `S` earlier, so no body is lost unless no sweep of its shard runs
//! for `T/2 − S` (`3T/8` by default: 5¼ days of 14). A renewal only ever pushes `ttl`
//! out, and only on body items that still have one below the renewal's threshold
//! (`need`: now + `T/2` for the sweep, availability + `3T/4` for the writes of 1.):
//! dead-lettering removes it after writing the state item, so a renewal racing it does
//! not give a dead letter's body a time to live back, and of two renewers racing the
//! second is refused rather than writing the body again (DynamoDB bills a refused
//! conditional write at the item's size too, so this saves the second write, not its
//! cost; the state read before it is what makes races rare).
//!
//! `body_exp` lives on the state item only, outside every index projection (the `due`
//! index projects `avail_us`, which is what the sweep selects on), so layout 2 is
//! unchanged; a state item without it is renewed and gets one. Each renewal writes
//! every body item, billed at its size.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use outbox_core::{Error, MessageId, Result};

use crate::error::{from_sdk, is_condition_failed};
use crate::item::{
    self, candidate_id, get_n, message_partition, message_pk, n, now_us, s, Item, AVAILABLE,
    BODY_EXP, DUE, DUE_INDEX, DUE_SCALE, PARTS, PK, SHARD, SK,
};
use crate::settle::BodyTtl;
use crate::store::{bounded, DynamoOutbox};

/// Most long-waiting messages one sweep step looks at; the rest wait for the next
/// step, so one step stays short.
const STEP_BUDGET: usize = 100;
/// Index entries per sweep page after the first (which reads one).
const PAGE: usize = 100;
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
    /// The body items of message `id` whose state item is `state`, in part order: an
    /// eventually consistent query of the message's partition (the body was committed
    /// with the state, long before in most cases), read again strongly consistent when
    /// parts are missing. Empty when the body is gone.
    pub(crate) async fn read_body(&self, id: MessageId, state: &Item) -> Result<Vec<Item>> {
        let parts = get_n::<usize>(state, PARTS).ok().flatten().unwrap_or(1);
        let mut body = self.query_body(id, false).await?;
        if body.len() < parts {
            body = self.query_body(id, true).await?;
        }
        Ok(body)
    }

    async fn query_body(&self, id: MessageId, consistent: bool) -> Result<Vec<Item>> {
        let mut body = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .inner
                .client
                .query()
                .table_name(self.table())
                .consistent_read(consistent)
                .key_condition_expression("#pk = :pk AND begins_with(#sk, :b)")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#sk", SK)
                .expression_attribute_values(":pk", s(message_pk(id)))
                .expression_attribute_values(":b", s("b#"))
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| from_sdk("read message body", e))?;
            self.record_capacity(&self.inner.metrics.body_read_units, out.consumed_capacity());
            body.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => return Ok(body),
            }
        }
    }

    fn body_ttl_us(&self) -> u64 {
        item::duration_us(self.inner.config.body_ttl())
    }

    /// Sweep the shards this store claims from for messages whose bodies need their
    /// time to live renewed, now, whatever the schedule (claims start a sweep on their
    /// own every [`body_sweep_every`](crate::DynamoOutboxConfig::with_body_sweep_every);
    /// see the crate docs, "Bodies of undelivered messages are renewed"). Reads the
    /// `due` index of each shard (with shard leases, those this store holds after a
    /// maintenance round), the state item of every undelivered message waiting longer
    /// than a quarter of `body_ttl`, and renews the bodies with less than half of
    /// `body_ttl` left. Useful from a maintenance job while relays are stopped for long
    /// (with shard leases, this store takes the lapsed leases of the stopped relays;
    /// call [`release_shards`](Self::release_shards) after). Waits for a sweep a claim
    /// started to finish first. Returns how many bodies were renewed.
    ///
    /// # Errors
    /// The first mapped SDK error, after every shard and message was tried; bodies
    /// renewed stay renewed.
    pub async fn renew_bodies(&self) -> Result<u64> {
        let shards = self.claim_shards().await?;
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
    /// pass), renewing what needs it, until the entries are younger than a quarter of
    /// `body_ttl` or `budget` messages were looked at. A message whose renewal fails is
    /// logged, counted and passed; a failed index query keeps the pass's position.
    async fn sweep_shard(&self, shard: u16, budget: &mut usize) -> Result<Pass> {
        let now = now_us();
        let cutoff = now.saturating_sub(self.body_ttl_us() / 4);
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
                .inner
                .client
                .query()
                .table_name(self.table())
                .index_name(DUE_INDEX)
                .key_condition_expression("#shard = :pk AND #due < :upper")
                .expression_attribute_names("#shard", SHARD)
                .expression_attribute_names("#due", DUE)
                .expression_attribute_values(":pk", s(message_partition(shard)))
                .expression_attribute_values(":upper", n((u128::from(now) + 1) * DUE_SCALE))
                .limit(i32::try_from(limit).unwrap_or(1))
                .set_exclusive_start_key(start.clone())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
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

    /// Renew message `id`'s body if it is still undelivered and its recorded expiry is
    /// less than half of `body_ttl` after `now`. Whether it renewed. The state read is
    /// eventually consistent and reads only what decides: `body_exp` only grows while
    /// the message is undelivered, so a stale one costs at most a refused write.
    async fn renew_if_expiring(&self, id: MessageId, now: u64) -> Result<bool> {
        let out = self
            .inner
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .projection_expression("#due, #exp, #parts")
            .expression_attribute_names("#due", DUE)
            .expression_attribute_names("#exp", BODY_EXP)
            .expression_attribute_names("#parts", PARTS)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| from_sdk("body sweep (state)", e))?;
        self.record_capacity(&self.inner.metrics.renewal_units, out.consumed_capacity());
        let Some(state) = out.item.filter(|state| state.contains_key(DUE)) else {
            return Ok(false);
        };
        let ttl = self.body_ttl_us();
        let need = now.saturating_add(ttl / 2);
        let expires = get_n::<u64>(&state, BODY_EXP).ok().flatten();
        if expires.is_some_and(|e| e.saturating_mul(1_000_000) >= need) {
            return Ok(false);
        }
        let parts = get_n::<usize>(&state, PARTS).ok().flatten().unwrap_or(1);
        self.renew_body(id, parts, now.saturating_add(ttl), need)
            .await
    }

    /// After a write that made `avail_us` the availability of message `id`: renew its
    /// body to `avail_us` + `body_ttl` when it expires (`body_exp`, epoch seconds;
    /// `None`: not known) less than three quarters of `body_ttl` after it. Best effort:
    /// a failure is logged, and the sweep renews the body later.
    pub(crate) async fn keep_body_ahead(
        &self,
        id: MessageId,
        parts: usize,
        body_exp: Option<u64>,
        avail_us: u64,
    ) {
        let ttl = self.body_ttl_us();
        let need = avail_us.saturating_add(ttl / 4 * 3);
        if body_exp.is_some_and(|e| e.saturating_mul(1_000_000) >= need) {
            return;
        }
        let at = avail_us.saturating_add(ttl);
        if let Err(e) = self.renew_body(id, parts, at, need).await {
            tracing::warn!(%id, error = %e.report(), "body time to live not renewed; the sweep will");
        }
    }

    /// [`keep_body_ahead`](Self::keep_body_ahead) from the state item a write returned.
    pub(crate) async fn keep_state_body_ahead(&self, id: MessageId, state: &Item, avail_us: u64) {
        let parts = get_n::<usize>(state, PARTS).ok().flatten().unwrap_or(1);
        let body_exp = get_n::<u64>(state, BODY_EXP).ok().flatten();
        self.keep_body_ahead(id, parts, body_exp, avail_us).await;
    }

    /// Push the time to live of message `id`'s `parts` body items out to `at_us`, on
    /// the items whose time to live is below `need_us` (both microseconds), then, when
    /// every part was written, record it on the state item while the message is
    /// undelivered (never moving it back). Body first: a crash in between costs a
    /// second renewal, never a state claiming more than the body has. Parts refused
    /// (another renewer got there first, or they are gone) leave `body_exp` to that
    /// renewer. Whether any part was renewed.
    async fn renew_body(
        &self,
        id: MessageId,
        parts: usize,
        at_us: u64,
        need_us: u64,
    ) -> Result<bool> {
        let at = at_us.div_ceil(1_000_000);
        let need = need_us.div_ceil(1_000_000);
        let written = self
            .set_body_ttl(id, parts, BodyTtl::Renew { at, need })
            .await?;
        if written == 0 {
            return Ok(false);
        }
        self.inner
            .metrics
            .bodies_renewed
            .fetch_add(1, Ordering::Relaxed);
        if written < parts {
            return Ok(true);
        }
        let sent = self
            .inner
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .update_expression("SET #exp = :at")
            .condition_expression(
                "attribute_exists(#due) AND (attribute_not_exists(#exp) OR #exp < :at)",
            )
            .expression_attribute_names("#exp", BODY_EXP)
            .expression_attribute_names("#due", DUE)
            .expression_attribute_values(":at", n(at))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record_capacity(&self.inner.metrics.renewal_units, out.consumed_capacity());
                Ok(true)
            }
            Err(e) if is_condition_failed(&e) => Ok(true),
            Err(e) => Err(from_sdk("record body time to live", e)),
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
