//! Claims: find due messages on the sparse global `due` index of the shards this store
//! claims from (eventually consistent queries, sorted by availability then enqueue
//! order, reading about as many entries as wanted), then one conditional `UpdateItem`
//! per message on its small state item, whose condition is the lease. The conditional
//! write is the claim: of two relays racing for a message, DynamoDB lets exactly one
//! write through, and a stale index entry only costs a refused write. The body is read
//! once, after the claim.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{ReturnConsumedCapacity, ReturnValue};
use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::ClaimedMessage, store::Lease,
    store::LeaseToken, Error, MessageId, Result,
};

use crate::concurrency::{bounded, bounded_all};
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{
    self, candidate, decode_message, get_s, marker_partition, marker_prefix, message_partition, n,
    now_us, s, shard_of, Candidate, Item, AVAILABLE, DUE, DUE_INDEX, DUE_SCALE, MARKED_ID, PK,
    SHARD, SK,
};
use crate::store::DynamoOutbox;

/// Most stale order markers one head check removes before giving up on the key for
/// this claim.
const MAX_STALE_MARKERS: usize = 64;

/// One shard's page of due-index entries and where the next page starts.
#[derive(Debug)]
struct Cursor {
    shard: u16,
    buffered: VecDeque<Candidate>,
    next: Option<Item>,
    exhausted: bool,
    /// Pages read again after a refused write showed this one stale.
    rereads: u32,
    /// Pages of this shard read by this claim so far: each next page is twice as long,
    /// so a claim walking past blocked keys needs few round trips while one that takes
    /// what it reads first reads little.
    pages: u32,
}

/// What one claim write came to.
#[derive(Debug)]
enum Taken {
    Claimed(Box<ClaimedMessage>),
    /// Another claimer won, or the message changed since it was read.
    Refused,
    /// Claimed, but not a valid message: dead-lettered (`true`) or, when that write
    /// failed, left to its lease (`false`).
    Poison(bool),
    /// The claim write or the body read after it failed for another reason than the
    /// write's condition (see [`DynamoOutbox::failed_take`]).
    Failed(Error),
}

/// How many times the oldest candidates a spreading claim draws from.
const SPREAD_WINDOW: usize = 4;
/// How long claims keep spreading after a refused write (microseconds).
const SPREAD_FOR_US: u64 = 1_000_000;
/// Most times one claim reads a shard again after refused writes.
const MAX_REREADS: u32 = 3;
/// Index entries read per shard beyond the shard's share of the claim: the slack that
/// covers blocked keys and entries gone stale.
const PAGE_SLACK: usize = 2;
/// How long (microseconds) a claim by this store keeps hiding the index entry it took
/// from this store's next claims: the global index is updated asynchronously, so for a
/// moment it may still show a message this store just claimed.
const RECENT_FOR_US: u64 = 5_000_000;

impl DynamoOutbox {
    /// Claim up to `request.limit()` due messages, oldest `due` first across shards.
    ///
    /// A refused write means another claimer works the same messages: the shard's page
    /// is stale, so it is read again, and the store switches to spreading for
    /// [`SPREAD_FOR`]: each batch is drawn at random from the oldest
    /// [`SPREAD_WINDOW`] × wanted candidates, so racing relays take different messages
    /// instead of queueing behind each other's refused writes.
    ///
    /// A failed request (a throttled write, query or body read) ends the claim after
    /// its round, and the claim returns what it took; only a claim that took nothing
    /// returns the error. Each message it could not take is left to its lease or
    /// released (see [`failed_take`](Self::failed_take)).
    pub(crate) async fn claim_due(&self, request: ClaimRequest) -> Result<Claimed> {
        let shards = self.claim_shards().await?;
        if shards.is_empty() {
            return Ok(Claimed::default());
        }
        // In the background: a sweep never holds the claim up.
        self.start_sweep(&shards);
        // After the shard maintenance, which may take round trips.
        let now = now_us();
        let mut cursors: Vec<Cursor> = shards
            .into_iter()
            .map(|shard| Cursor {
                shard,
                buffered: VecDeque::new(),
                next: None,
                exhausted: false,
                rereads: 0,
                pages: 0,
            })
            .collect();
        let mut heads: HashMap<String, Option<MessageId>> = HashMap::new();
        let mut claimed = Vec::new();
        let mut dead_lettered = 0;
        let mut failure: Option<Error> = None;
        'rounds: loop {
            let want = request.limit() - claimed.len();
            let spread = self.inner.contended_until.load(Ordering::Relaxed) > now_us();
            let window = if spread { want * SPREAD_WINDOW } else { want };
            let page = window.div_ceil(cursors.len().max(1)) + PAGE_SLACK;
            let mut batch = Vec::new();
            while batch.len() < window {
                if let Err(e) = self.refill(&mut cursors, now, page).await {
                    failure = Some(e);
                    break 'rounds;
                }
                let tranche = self.next_tranche(&mut cursors, window - batch.len());
                if tranche.is_empty() {
                    if cursors.iter().all(|c| c.buffered.is_empty() && c.exhausted) {
                        break;
                    }
                    continue;
                }
                match self.heads_only(tranche, &mut heads).await {
                    Ok(heads) => batch.extend(heads),
                    Err(e) => {
                        failure = Some(e);
                        break 'rounds;
                    }
                }
            }
            if batch.is_empty() {
                break;
            }
            if spread {
                fastrand::shuffle(&mut batch);
                batch.truncate(want);
                batch.sort_by_key(|c| c.due);
            }
            let lease = request.lease();
            let placed: Vec<(Option<u16>, u128)> = batch.iter().map(|c| (c.shard, c.due)).collect();
            self.remember_taken(&batch);
            let taken: Vec<Taken> =
                bounded_all(batch.into_iter().map(|c| self.take(c, lease)).collect()).await;
            for (outcome, (shard, due)) in taken.into_iter().zip(placed) {
                match outcome {
                    Taken::Claimed(m) => claimed.push((due, *m)),
                    Taken::Poison(written) => dead_lettered += usize::from(written),
                    Taken::Failed(e) => {
                        failure.get_or_insert(e);
                    }
                    Taken::Refused => {
                        self.inner
                            .contended_until
                            .fetch_max(now_us() + SPREAD_FOR_US, Ordering::Relaxed);
                        if let Some(cursor) = cursors.iter_mut().find(|c| Some(c.shard) == shard) {
                            cursor.buffered.clear();
                            cursor.next = None;
                            cursor.rereads += 1;
                            cursor.exhausted = cursor.rereads > MAX_REREADS;
                        }
                    }
                }
            }
            // After a failure, more rounds would only meet more of it (a throttled
            // table or index): return what was taken.
            if claimed.len() >= request.limit() || failure.is_some() {
                break;
            }
        }
        if let Some(e) = failure {
            if claimed.is_empty() && dead_lettered == 0 {
                return Err(e);
            }
            tracing::warn!(
                claimed = claimed.len(),
                error = %e.report(),
                "claim cut short by a failed request; returning what it took"
            );
        }
        claimed.sort_by_key(|(due, _)| *due);
        let messages = claimed.into_iter().map(|(_, m)| m).collect();
        Ok(Claimed::new(messages).with_dead_lettered(dead_lettered))
    }

    /// Whether this store took `c` (at this very `due`) moments ago, so the index entry
    /// is one the asynchronous global index has not updated yet.
    fn recently_taken(&self, c: &Candidate) -> bool {
        let recent = self
            .inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.get(&c.id).is_some_and(|(due, _)| *due == c.due)
    }

    /// Remember the index entries of `batch` as taken by this store (see
    /// [`recently_taken`](Self::recently_taken)), forgetting old ones.
    fn remember_taken(&self, batch: &[Candidate]) {
        let now = now_us();
        let mut recent = self
            .inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.retain(|_, (_, at)| now.saturating_sub(*at) < RECENT_FOR_US);
        for c in batch {
            recent.insert(c.id, (c.due, now));
        }
    }

    /// A query of shard `shard`'s entries in the `due` index that are due at `now`
    /// (microseconds) or before, oldest first, reporting the capacity it consumed.
    pub(crate) fn due_query(&self, shard: u16, now: u64) -> QueryFluentBuilder {
        self.inner
            .client
            .query()
            .table_name(self.table())
            .index_name(DUE_INDEX)
            .key_condition_expression("#shard = :pk AND #due < :upper")
            .expression_attribute_names("#shard", SHARD)
            .expression_attribute_names("#due", DUE)
            .expression_attribute_values(":pk", s(message_partition(shard)))
            .expression_attribute_values(":upper", n((u128::from(now) + 1) * DUE_SCALE))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
    }

    /// Fetch the next page of every shard whose buffer ran dry and that has more.
    async fn refill(&self, cursors: &mut [Cursor], now: u64, page: usize) -> Result<()> {
        let dry: Vec<&mut Cursor> = cursors
            .iter_mut()
            .filter(|c| c.buffered.is_empty() && !c.exhausted)
            .collect();
        if dry.is_empty() {
            return Ok(());
        }
        let futures: Vec<_> = dry
            .into_iter()
            .map(|cursor| async move {
                let grown = page.saturating_mul(1 << cursor.pages.min(10)).min(1000);
                cursor.pages += 1;
                let out = self
                    .due_query(cursor.shard, now)
                    .limit(i32::try_from(grown).unwrap_or(1000))
                    .set_exclusive_start_key(cursor.next.take())
                    .send()
                    .await
                    .map_err(|e| from_sdk("claim", e))?;
                self.record_capacity(
                    &self.inner.metrics.claim_read_units,
                    out.consumed_capacity(),
                );
                for entry in out.items() {
                    match candidate(entry) {
                        Ok(c) => cursor.buffered.push_back(c),
                        // Not a message (a planted item with the index's keys):
                        // nothing can take it, and it must not stop the shard.
                        Err(e) => tracing::warn!(
                            shard = cursor.shard,
                            error = %e.report(),
                            "due index entry skipped: it is not a message's state item"
                        ),
                    }
                }
                cursor.next = out.last_evaluated_key().cloned();
                cursor.exhausted = cursor.next.is_none();
                Ok::<_, outbox_core::Error>(())
            })
            .collect();
        bounded(futures).await?;
        Ok(())
    }

    /// Up to `n` candidates in `due` order across `cursors`, leaving out those this
    /// store took moments ago; fewer when a shard still being read runs out of
    /// buffered entries (the merge stays in order only while every such shard has one).
    fn next_tranche(&self, cursors: &mut [Cursor], n: usize) -> Vec<Candidate> {
        let mut tranche = Vec::new();
        while tranche.len() < n {
            if cursors
                .iter()
                .any(|c| c.buffered.is_empty() && !c.exhausted)
            {
                break;
            }
            let Some(next) = cursors
                .iter_mut()
                .filter(|c| !c.buffered.is_empty())
                .min_by_key(|c| c.buffered[0].due)
            else {
                break;
            };
            let Some(c) = next.buffered.pop_front() else {
                break;
            };
            if !self.recently_taken(&c) {
                tranche.push(c);
            }
        }
        tranche
    }

    /// The candidates of `tranche` (in order) that may be claimed under the store's
    /// ordering: all when unordered or unkeyed; under per-key order, a key's head only.
    /// The heads of keys not yet in `heads` are read concurrently (one strongly
    /// consistent marker query each) and remembered for the rest of the claim.
    async fn heads_only(
        &self,
        tranche: Vec<Candidate>,
        heads: &mut HashMap<String, Option<MessageId>>,
    ) -> Result<Vec<Candidate>> {
        if !self.per_key() {
            return Ok(tranche);
        }
        let mut unknown: Vec<(&str, MessageId)> = Vec::new();
        for c in &tranche {
            if let Some(key) = c.key.as_deref() {
                if !heads.contains_key(key) && unknown.iter().all(|(k, _)| *k != key) {
                    unknown.push((key, c.id));
                }
            }
        }
        let found: Vec<Option<MessageId>> = bounded(
            unknown
                .iter()
                .map(|(key, id)| self.head_of(key, *id))
                .collect(),
        )
        .await?;
        for ((key, _), head) in unknown.iter().zip(found) {
            heads.insert((*key).to_owned(), head);
        }
        Ok(tranche
            .into_iter()
            .filter(|c| {
                c.key
                    .as_deref()
                    .and_then(|key| heads.get(key))
                    .is_none_or(|head| head.is_none_or(|h| h == c.id))
            })
            .collect())
    }

    /// The oldest undelivered message of `key` by its order markers, removing markers
    /// of messages that were delivered or dead-lettered; `None` when the key has no
    /// live marker.
    async fn head_of(&self, key: &str, candidate_id: MessageId) -> Result<Option<MessageId>> {
        let key_shards = self.checked_shards()?.key_shards;
        let partition = marker_partition(shard_of(&[key.as_bytes()], key_shards));
        for _ in 0..MAX_STALE_MARKERS {
            let out = self
                .inner
                .client
                .query()
                .table_name(self.table())
                .consistent_read(true)
                .key_condition_expression("#pk = :pk AND begins_with(#sk, :prefix)")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#sk", SK)
                .expression_attribute_values(":pk", s(&partition))
                .expression_attribute_values(":prefix", s(marker_prefix(key)))
                .limit(1)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| from_sdk("claim (order marker)", e))?;
            self.record_capacity(
                &self.inner.metrics.claim_read_units,
                out.consumed_capacity(),
            );
            let Some(marker) = out.items().first() else {
                return Ok(None);
            };
            let Some(first) = get_s(marker, MARKED_ID)
                .and_then(|t| uuid::Uuid::parse_str(t).ok())
                .map(MessageId::from_uuid)
            else {
                return Ok(None);
            };
            if first == candidate_id || self.undelivered(first).await? {
                return Ok(Some(first));
            }
            let key_attrs: Item = marker
                .iter()
                .filter(|(k, _)| *k == PK || *k == SK)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            // Conditional on the message still not being undelivered: a requeue that
            // committed since the read above keeps its marker.
            match self.delete_marker_if_settled(key_attrs, first).await {
                Ok(true) => {}
                Ok(false) => return Ok(Some(first)),
                // A transaction conflict (a requeue of that very message in flight):
                // the key waits for the next claim rather than failing this one.
                Err(e) if e.is_retryable() => {
                    tracing::debug!(key, error = %e.report(), "stale order marker kept for now");
                    return Ok(Some(first));
                }
                Err(e) => return Err(e),
            }
        }
        tracing::warn!(
            key,
            "too many stale order markers; the key waits for the next claim"
        );
        Ok(Some(MessageId::from_uuid(uuid::Uuid::nil())))
    }

    /// Whether message `id` exists and is undelivered (a strongly consistent read).
    async fn undelivered(&self, id: MessageId) -> Result<bool> {
        Ok(self
            .read(id)
            .await?
            .is_some_and(|item| item.contains_key(DUE)))
    }

    /// Read message `id`'s state item, strongly consistent.
    pub(crate) async fn read(&self, id: MessageId) -> Result<Option<Item>> {
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
            .map_err(|e| from_sdk("read message", e))?;
        self.record_capacity(
            &self.inner.metrics.claim_read_units,
            out.consumed_capacity(),
        );
        Ok(out.item)
    }

    /// The conditional write that claims `c`: due (undelivered, available) at the time
    /// of the write, attempts counted up to [`MAX_ATTEMPTS`]. `Refused` when another
    /// claimer won or the message changed since it was read; rows that do not make a
    /// valid message are dead-lettered under the new lease and left out; a failed
    /// request is `Failed` (see [`failed_take`](Self::failed_take)).
    async fn take(&self, c: Candidate, lease: std::time::Duration) -> Taken {
        let now = now_us();
        let expires = now.saturating_add(item::duration_us(lease));
        let token = LeaseToken::new();
        let counted = c.malformed.is_none() && c.attempts < u64::from(MAX_ATTEMPTS);
        let (update, condition) = if c.malformed.is_some() {
            // Attempts do not decode, so they cannot guard the write: the entry's
            // unchanged `due` shows nobody took the message since it was read. The
            // state then fails to decode below, which dead-letters the message.
            (
                "SET #avail_us = :exp, #due = :due, #token = :token",
                "#due = :seen".to_owned(),
            )
        } else if counted {
            (
                "SET #avail_us = :exp, #due = :due, #token = :token ADD #attempts :one",
                "attribute_exists(#due) AND #avail_us <= :now AND #attempts < :max".to_owned(),
            )
        } else {
            (
                "SET #avail_us = :exp, #due = :due, #token = :token",
                "attribute_exists(#due) AND #avail_us <= :now AND #attempts >= :max".to_owned(),
            )
        };
        let mut request = self
            .inner
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(self.key_of(c.id)))
            .set_expression_attribute_names(Some(item::names(&[update, &condition])))
            .update_expression(update)
            .condition_expression(condition)
            .expression_attribute_values(":exp", n(expires))
            .expression_attribute_values(
                ":due",
                n(u128::from(expires) * DUE_SCALE + u128::from(c.seq())),
            )
            .expression_attribute_values(":token", s(token.as_uuid().to_string()))
            .return_values(ReturnValue::AllNew)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        if counted {
            request = request.expression_attribute_values(":one", n(1));
        }
        request = match c.malformed {
            Some(_) => request.expression_attribute_values(":seen", n(c.due)),
            None => request
                .expression_attribute_values(":now", n(now))
                .expression_attribute_values(":max", n(MAX_ATTEMPTS)),
        };
        let item = match request.send().await {
            Ok(out) => {
                self.record_capacity(
                    &self.inner.metrics.claim_write_units,
                    out.consumed_capacity(),
                );
                out.attributes.unwrap_or_default()
            }
            Err(e) if is_condition_failed(&e) => {
                self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                return Taken::Refused;
            }
            Err(e) => return self.failed_take(c.id, from_sdk("claim", e), None).await,
        };
        let lease = Lease {
            id: c.id,
            token,
            expires_at: item::from_micros(expires),
        };
        let body = match self.read_body(c.id, &item).await {
            Ok(body) => body,
            Err(e) => return self.failed_take(c.id, e, Some(&lease)).await,
        };
        let checked = match &c.malformed {
            Some(why) => Err(why.clone()),
            None => decode_message(&item, &body)
                .and_then(|m| m.check_stored(self.inner.config.limits()).map(|()| m)),
        };
        if checked.is_ok() {
            // Kept ahead of the new lease, by the expiry the state records (a body
            // item without a time to live refuses the renewal).
            self.keep_state_body_ahead(c.id, &item, expires).await;
        }
        match checked {
            Ok(message) => {
                self.inner.metrics.claimed.fetch_add(1, Ordering::Relaxed);
                Taken::Claimed(Box::new(ClaimedMessage { message, lease }))
            }
            Err(reason) => {
                let reason = outbox_core::backend::bounded_error(format!(
                    "dead-lettered by the claim: {reason}"
                ));
                let written = match self.dead_letter(&lease, &reason).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(id = %c.id, error = %e.report(), "poison message not dead-lettered; its lease will lapse");
                        false
                    }
                };
                Taken::Poison(written)
            }
        }
    }

    /// Account for message `id`, which a claim could not take because of `error`: the
    /// claim write failed (`lease` is `None`; the write may have landed, as after a
    /// timeout, and then the message is left to that lease), or the body read after a
    /// successful write did (the message is released under `lease`, attempt given
    /// back, or left to it when the release fails too). Counted in `claim_errors`, and
    /// no longer hidden from this store's next claims.
    async fn failed_take(&self, id: MessageId, error: Error, lease: Option<&Lease>) -> Taken {
        self.inner
            .metrics
            .claim_errors
            .fetch_add(1, Ordering::Relaxed);
        let released = match lease {
            None => false,
            Some(lease) => match self.release_one(lease).await {
                Ok(released) => released,
                Err(e) => {
                    tracing::warn!(%id, error = %e.report(), "release after a failed body read failed");
                    false
                }
            },
        };
        tracing::warn!(
            %id,
            error = %error.report(),
            released,
            "message not claimed: a request failed; it is left to its lease unless released"
        );
        self.inner
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        Taken::Failed(error)
    }

    /// Claim exactly the listed ids that are due: read each (strongly consistent), order
    /// the due ones like [`claim_due`](Self::claim_due), check key heads, take them.
    pub(crate) async fn claim_listed(&self, request: &ClaimIds) -> Result<Claimed> {
        if request.ids().is_empty() {
            return Ok(Claimed::default());
        }
        let now = now_us();
        let items: Vec<Option<Item>> =
            bounded(request.ids().iter().map(|id| self.read(*id)).collect()).await?;
        let mut due: Vec<Candidate> = Vec::new();
        for item in items.into_iter().flatten() {
            if !item.contains_key(DUE) {
                continue;
            }
            let c = candidate(&item)?;
            let available: Option<u64> = item::get_n(&item, AVAILABLE)?;
            if available.is_some_and(|a| a <= now) {
                due.push(c);
            }
        }
        due.sort_by_key(|c| c.due);
        let batch = self.heads_only(due, &mut HashMap::new()).await?;
        let lease = request.lease();
        let taken: Vec<Taken> =
            bounded_all(batch.into_iter().map(|c| self.take(c, lease)).collect()).await;
        let mut claimed = Claimed::default();
        let mut failure = None;
        for t in taken {
            match t {
                Taken::Claimed(m) => claimed.messages.push(*m),
                Taken::Poison(written) => claimed.dead_lettered += usize::from(written),
                Taken::Refused => {}
                Taken::Failed(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) if claimed.messages.is_empty() && claimed.dead_lettered == 0 => Err(e),
            _ => Ok(claimed),
        }
    }
}
