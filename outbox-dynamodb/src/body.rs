//! Bodies: reading a message's body items, and keeping the bodies of undelivered
//! messages alive.
//!
//! Body items expire by DynamoDB's time to live (`ttl`, epoch seconds), so a message
//! that waits long must have it pushed out before it passes. With `T` =
//! [`body_ttl`](crate::DynamoOutboxConfig::with_body_ttl):
//!
//! 1. **Headroom.** Every write that sets a message's availability keeps its body's
//!    expiry at least `T/2` past that availability: enqueue and requeue write
//!    availability + `T`; a claim (availability = lease expiry), a retry (the backoff's
//!    end) and a release that find less renew it to availability + `T`. `T/2` is the
//!    sweep's own need (below), so while sweeps run a claim renews nothing the sweep
//!    already keeps ahead, and draining a backlog that waited less than `T/2` rewrites
//!    no body.
//! 2. **Sweep.** Every [`body_sweep_every`](crate::DynamoOutboxConfig::with_body_sweep_every)
//!    (default `T/8`, at most `T/4`), a claim starts a background task (one at a time
//!    per store; the claim does not wait for it) that walks the `due` index of each
//!    shard the store claims from, oldest first: the first entry (one read) gives how
//!    long the oldest due message waited (the
//!    [`oldest_due_age`](crate::OutboxMetrics::oldest_due_age) gauge); entries whose
//!    availability is more than `T/16` old are the messages waiting long (blocked
//!    behind their key's head, a backlog far behind, put back by a release or
//!    requeue), normally none. For each, the state item is read (eventually
//!    consistent: `body_exp` only grows while the message is undelivered, so a stale
//!    read costs at most a refused write); if it is still undelivered and its
//!    `body_exp` is less than `T/2` away, the body items' `ttl` is set to now + `T`
//!    and then `body_exp` too, each write waiting for the store's
//!    [renewal budget](crate::DynamoOutboxConfig::with_renewal_budget) and charged to
//!    it. A message whose renewal fails is logged and counted
//!    ([`body_sweep_errors`](crate::OutboxMetrics::body_sweep_errors)) and the pass goes
//!    on; a shard whose index query fails is tried again a minute later, from where
//!    its pass stood.
//!
//! A message not yet waiting `T/16` has more than `T/2 − T/16 = 7T/16` of body left,
//! and one a sweep looked at and left alone has at least `T/2` left then; so while
//! sweeps run every interval `S` (at most `T/4`) no body expires (the thinnest margin,
//! a message that started waiting long just after a sweep, is `7T/16 − S ≥ 3T/16`).
//! When sweeps stop, the last one ran at most `S` earlier, so no body is lost unless no
//! sweep of its shard runs for `7T/16 − S` (`5T/16` by default: 4⅜ days of 14). The
//! window is `T/16` rather than wider because headroom minus window is what a stopped
//! sweep leaves: reading the state of messages waiting a day (at the default `T`)
//! costs half a read unit each per pass, renewing them early would cost their body.
//! Renewals by the writes of 1. are not paced by the budget: each guards a message the
//! sweep will not look at before it has waited `T/16`, so delaying or skipping it
//! could cost its body; they are rare while sweeps run. A renewal only ever pushes `ttl`
//! out, and only on body items that still have one below the renewal's threshold
//! (`need`: now + `T/2` for the sweep, availability + `T/2` for the writes of 1.):
//! dead-lettering removes it (in the transaction that writes the state item), so a
//! renewal racing it does not give a dead letter's body a time to live back, and of two renewers racing the
//! second is refused rather than writing the body again (DynamoDB bills a refused
//! conditional write at the item's size too, so this saves the second write, not its
//! cost; the state read before it is what makes races rare).
//!
//! `body_exp` lives on the state item only, outside every index projection (the `due`
//! index projects `avail_us`, which is what the sweep selects on), so layout 2 is
//! unchanged; a state item without it is renewed and gets one. Each renewal writes
//! every body item, billed at its size.

use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity};
use outbox_core::{MessageId, Result};

use crate::error::{from_sdk, is_condition_failed};
use crate::item::{self, get_n, message_pk, n, s, Item, BODY_EXP, DUE, PARTS, PK, SK};
use crate::settle::BodyTtl;
use crate::store::DynamoOutbox;

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
        let query = self
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
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let units = &self.inner.metrics.body_read_units;
        self.query_all(query, "read message body", Some(units))
            .await
    }

    pub(crate) fn body_ttl_us(&self) -> u64 {
        item::duration_us(self.inner.config.body_ttl())
    }

    /// Renew message `id`'s body if it is still undelivered and its recorded expiry is
    /// less than half of `body_ttl` after `now`. Whether it renewed. The state read is
    /// eventually consistent and reads only what decides: `body_exp` only grows while
    /// the message is undelivered, so a stale one costs at most a refused write.
    pub(crate) async fn renew_if_expiring(&self, id: MessageId, now: u64) -> Result<bool> {
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
        self.renew_body(id, parts, now.saturating_add(ttl), need, true)
            .await
    }

    /// Wait for the store's renewal budget (when it has one), counting a wait.
    pub(crate) async fn renewal_budget_ready(&self) {
        if let Some(budget) = &self.inner.renewal_budget {
            if budget.ready().await {
                self.inner
                    .metrics
                    .sweep_budget_waits
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Charge what a paced renewal write consumed to the store's renewal budget.
    pub(crate) fn charge_renewal(&self, consumed: Option<&ConsumedCapacity>) {
        if let (Some(budget), Some(units)) = (
            &self.inner.renewal_budget,
            consumed.and_then(ConsumedCapacity::capacity_units),
        ) {
            budget.charge(units);
        }
    }

    /// After a write that made `avail_us` the availability of message `id`: renew its
    /// body to `avail_us` + `body_ttl` when it expires (`body_exp`, epoch seconds;
    /// `None`: not known) less than half of `body_ttl` after it. Best effort:
    /// a failure is logged, and the sweep renews the body later.
    pub(crate) async fn keep_body_ahead(
        &self,
        id: MessageId,
        parts: usize,
        body_exp: Option<u64>,
        avail_us: u64,
    ) {
        let ttl = self.body_ttl_us();
        let need = avail_us.saturating_add(ttl / 2);
        if body_exp.is_some_and(|e| e.saturating_mul(1_000_000) >= need) {
            return;
        }
        let at = avail_us.saturating_add(ttl);
        if let Err(e) = self.renew_body(id, parts, at, need, false).await {
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
        paced: bool,
    ) -> Result<bool> {
        let at = at_us.div_ceil(1_000_000);
        let need = need_us.div_ceil(1_000_000);
        let written = self
            .set_body_ttl(id, parts, BodyTtl::Renew { at, need, paced })
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
        if paced {
            self.renewal_budget_ready().await;
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
                if paced {
                    self.charge_renewal(out.consumed_capacity());
                }
                Ok(true)
            }
            Err(e) if is_condition_failed(&e) => Ok(true),
            Err(e) => Err(from_sdk("record body time to live", e)),
        }
    }
}
