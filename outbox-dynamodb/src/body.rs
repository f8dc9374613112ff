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
//!    (default `T/8`, at most `T/4`), inside a claim, a store walks the `due` index of
//!    each shard it claims from, oldest first: the first entry (one read) gives how
//!    long the oldest due message waited (the
//!    [`oldest_due_age`](crate::OutboxMetrics::oldest_due_age) gauge); entries whose
//!    availability is more than `T/4` old are the messages waiting long (blocked
//!    behind their key's head, a backlog far behind, put back by a release or
//!    requeue), normally none. For each, the state item is read (strongly consistent);
//!    if it is still undelivered and its `body_exp` is less than `T/2` away, the body
//!    items' `ttl` is set to now + `T` and then `body_exp` too.
//!
//! A message not yet waiting `T/4` has at least `3T/4 − T/4 = T/2` of body left, and
//! one a sweep looked at and left alone has at least `T/2` left then; so while sweeps
//! run every interval `S` (at most `T/4`) no body expires. When sweeps stop, the last
//! one ran at most `S` earlier, so no body is lost unless no sweep of its shard runs
//! for `T/2 − S` (`3T/8` by default: 5¼ days of 14). A renewal only ever pushes `ttl`
//! out, and only on body items that still have one: dead-lettering removes it after
//! writing the state item, so a renewal racing it does not give a dead letter's body
//! a time to live back.
//!
//! `body_exp` lives on the state item only, outside every index projection (the `due`
//! index projects `avail_us`, which is what the sweep selects on), so layout 2 is
//! unchanged; a state item without it is renewed and gets one. Each renewal writes
//! every body item, billed at its size.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use outbox_core::{MessageId, Result};

use crate::error::{from_sdk, is_condition_failed};
use crate::item::{
    self, candidate_id, get_n, message_partition, message_pk, n, now_us, s, Item, AVAILABLE,
    BODY_EXP, DUE, DUE_INDEX, DUE_SCALE, PARTS, PK, SHARD, SK,
};
use crate::settle::BodyTtl;
use crate::store::{bounded, DynamoOutbox};

/// Most long-waiting messages one claim's sweep step looks at; the rest wait for the
/// next claim, so a sweep never holds a claim up for long.
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
    running: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct ShardSweep {
    /// When the shard is next swept (microseconds; 0: at once).
    next_at: u64,
    /// Where an unfinished pass goes on.
    resume: Option<Item>,
    /// How long the oldest due message had waited when the last pass began
    /// (microseconds).
    oldest_due_age_us: Option<u64>,
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
    /// time to live renewed, now, whatever the schedule (claims do it on their own every
    /// [`body_sweep_every`](crate::DynamoOutboxConfig::with_body_sweep_every); see the
    /// crate docs, "Bodies of undelivered messages are renewed"). Reads the `due` index of each shard
    /// (with shard leases, those this store holds after a maintenance round), the state
    /// item of every undelivered message waiting longer than a quarter of `body_ttl`,
    /// and renews the bodies with less than half of `body_ttl` left. Useful from a
    /// maintenance job while relays are stopped for long (with shard leases, this store
    /// takes the lapsed leases of the stopped relays; call
    /// [`release_shards`](Self::release_shards) after). Returns how many bodies were
    /// renewed.
    ///
    /// # Errors
    /// Mapped SDK errors; bodies renewed before the error stay renewed.
    pub async fn renew_bodies(&self) -> Result<u64> {
        let shards = self.claim_shards().await?;
        let _guard = self.inner.sweep.running.lock().await;
        let mut renewed = 0;
        for shard in shards {
            if let Some(sweep) = self.inner.sweep.shards().get_mut(&shard) {
                sweep.resume = None;
            }
            let mut budget = usize::MAX;
            renewed += self.sweep_shard(shard, &mut budget).await?;
        }
        self.publish_sweep_gauge();
        Ok(renewed)
    }

    /// One claim's share of the sweep: the shards of `shards` whose sweep is due, until
    /// [`STEP_BUDGET`] long-waiting messages were looked at. Never fails the claim: an
    /// error is logged and the shard tried again a minute later.
    pub(crate) async fn sweep_step(&self, shards: &[u16]) {
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
        let Ok(_guard) = self.inner.sweep.running.try_lock() else {
            return;
        };
        let mut budget = STEP_BUDGET;
        for shard in due {
            if budget == 0 {
                break;
            }
            if let Err(e) = self.sweep_shard(shard, &mut budget).await {
                tracing::warn!(shard, error = %e.report(), "body sweep failed; the shard is tried again in a minute");
                let mut map = self.inner.sweep.shards();
                let sweep = map.entry(shard).or_default();
                sweep.next_at = now_us().saturating_add(RETRY_AFTER_US);
                sweep.resume = None;
            }
        }
        self.publish_sweep_gauge();
    }

    /// Walk shard `shard`'s due entries oldest first (going on from an unfinished
    /// pass), renewing what needs it, until the entries are younger than a quarter of
    /// `body_ttl` or `budget` messages were looked at. Returns the bodies renewed.
    async fn sweep_shard(&self, shard: u16, budget: &mut usize) -> Result<u64> {
        let now = now_us();
        let cutoff = now.saturating_sub(self.body_ttl_us() / 4);
        let mut start = self
            .inner
            .sweep
            .shards()
            .entry(shard)
            .or_default()
            .resume
            .take();
        let mut first = start.is_none();
        let mut renewed = 0;
        loop {
            let limit = if first { 1 } else { (*budget).clamp(1, PAGE) };
            let out = self
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
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| from_sdk("body sweep", e))?;
            self.record_capacity(&self.inner.metrics.renewal_units, out.consumed_capacity());
            let entries = out.items.unwrap_or_default();
            let next = out.last_evaluated_key.filter(|k| !k.is_empty());
            if first {
                let oldest = match entries.first() {
                    Some(e) => get_n::<u64>(e, AVAILABLE)?.map(|a| now.saturating_sub(a)),
                    None => None,
                };
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
                if get_n::<u64>(entry, AVAILABLE)?.unwrap_or(0) >= cutoff {
                    passed = true;
                    break;
                }
                ids.extend(candidate_id(entry));
            }
            *budget = budget.saturating_sub(ids.len());
            let looked: Vec<bool> = bounded(
                ids.into_iter()
                    .map(|id| self.renew_if_expiring(id, now))
                    .collect(),
            )
            .await?;
            renewed += looked.into_iter().map(u64::from).sum::<u64>();
            let mut map = self.inner.sweep.shards();
            let sweep = map.entry(shard).or_default();
            match next {
                Some(key) if !passed && *budget > 0 => start = Some(key),
                Some(key) if !passed => {
                    sweep.resume = Some(key);
                    return Ok(renewed);
                }
                _ => {
                    let every = item::duration_us(self.inner.config.body_sweep_every());
                    sweep.next_at = now_us().saturating_add(every);
                    sweep.resume = None;
                    return Ok(renewed);
                }
            }
        }
    }

    /// Renew message `id`'s body if it is still undelivered and its recorded expiry is
    /// less than half of `body_ttl` after `now`. Whether it renewed.
    async fn renew_if_expiring(&self, id: MessageId, now: u64) -> Result<bool> {
        let out = self
            .inner
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| from_sdk("body sweep (state)", e))?;
        self.record_capacity(&self.inner.metrics.renewal_units, out.consumed_capacity());
        let Some(state) = out.item.filter(|state| state.contains_key(DUE)) else {
            return Ok(false);
        };
        let ttl = self.body_ttl_us();
        let expires = get_n::<u64>(&state, BODY_EXP).ok().flatten();
        if expires.is_some_and(|e| e.saturating_mul(1_000_000) >= now.saturating_add(ttl / 2)) {
            return Ok(false);
        }
        let parts = get_n::<usize>(&state, PARTS).ok().flatten().unwrap_or(1);
        self.renew_body(id, parts, now.saturating_add(ttl).div_ceil(1_000_000))
            .await?;
        Ok(true)
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
        let needed = avail_us.saturating_add(ttl / 4 * 3);
        if body_exp.is_some_and(|e| e.saturating_mul(1_000_000) >= needed) {
            return;
        }
        let at = avail_us.saturating_add(ttl).div_ceil(1_000_000);
        if let Err(e) = self.renew_body(id, parts, at).await {
            tracing::warn!(%id, error = %e.report(), "body time to live not renewed; the sweep will");
        }
    }

    /// [`keep_body_ahead`](Self::keep_body_ahead) from the state item a settle returned.
    pub(crate) async fn keep_state_body_ahead(&self, id: MessageId, state: &Item, avail_us: u64) {
        let parts = get_n::<usize>(state, PARTS).ok().flatten().unwrap_or(1);
        let body_exp = get_n::<u64>(state, BODY_EXP).ok().flatten();
        self.keep_body_ahead(id, parts, body_exp, avail_us).await;
    }

    /// Push the time to live of message `id`'s `parts` body items out to `at` (epoch
    /// seconds), then record it on the state item while the message is undelivered
    /// (never moving it back). Body first: a crash in between costs a second renewal,
    /// never a state claiming more than the body has.
    async fn renew_body(&self, id: MessageId, parts: usize, at: u64) -> Result<()> {
        self.set_body_ttl(id, parts, BodyTtl::Renew(at)).await?;
        self.inner
            .metrics
            .bodies_renewed
            .fetch_add(1, Ordering::Relaxed);
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
                Ok(())
            }
            Err(e) if is_condition_failed(&e) => Ok(()),
            Err(e) => Err(from_sdk("record body time to live", e)),
        }
    }

    /// Publish the gauge of the sweeps: the longest wait of an oldest due message over
    /// the shards swept (as of each shard's last pass), and now as the sweep time.
    fn publish_sweep_gauge(&self) {
        let oldest = self
            .inner
            .sweep
            .shards()
            .values()
            .filter_map(|s| s.oldest_due_age_us)
            .max();
        let metrics = &self.inner.metrics;
        // 0 stands for none.
        let stored = oldest.map_or(0, |age| age.saturating_add(1));
        metrics.oldest_due_age_us.store(stored, Ordering::Relaxed);
        metrics.swept_us.store(now_us(), Ordering::Relaxed);
    }
}
