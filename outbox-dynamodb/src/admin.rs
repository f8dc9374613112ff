//! [`OutboxAdmin`] for [`DynamoOutbox`]: counts and listings from queries of the sparse
//! global indexes of every shard (`due` for undelivered, `dead` for dead letters, `done`
//! for kept dispatched messages; eventually consistent, as global indexes are);
//! changes by primary key, each a conditional write on the state item it changes.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{ReturnConsumedCapacity, ReturnValue, Select};
use outbox_core::backend::{dead_target, purge_limit, DeadTarget};
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, DeadLetterSelection, MessageId,
    OutboxAdmin, OutboxStats, Result, Retention,
};

use crate::concurrency::bounded;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{
    self, body_key, decode_lossy, get_n, id_text, message_partition, n, now_us, s, Item, CREATED,
    DEAD_AT, DEAD_ID, DEAD_INDEX, DONE_AT, DONE_INDEX, DUE, DUE_INDEX, DUE_SCALE, PARTS, SHARD,
    TOKEN,
};
use crate::store::DynamoOutbox;

/// One query of one shard's global index, every page.
#[derive(Debug, Clone)]
struct IndexQuery {
    index: &'static str,
    condition: String,
    values: Vec<(&'static str, aws_sdk_dynamodb::types::AttributeValue)>,
    forward: bool,
    count_only: bool,
}

impl DynamoOutbox {
    /// Run `q` on `shard`, calling `visit` per item until it returns `false`; returns
    /// the count (for `count_only`) or the number of items visited.
    async fn query_shard(
        &self,
        shard: u16,
        q: &IndexQuery,
        mut visit: impl FnMut(Item) -> bool,
    ) -> Result<u64> {
        let mut start = None;
        let mut total: u64 = 0;
        loop {
            let mut request = self
                .inner
                .client
                .query()
                .table_name(self.table())
                .index_name(q.index)
                .set_expression_attribute_names(Some(item::names(&[&q.condition])))
                .key_condition_expression(&q.condition)
                .expression_attribute_values(":pk", s(message_partition(shard)))
                .scan_index_forward(q.forward)
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total);
            if q.count_only {
                request = request.select(Select::Count);
            }
            for (name, value) in &q.values {
                request = request.expression_attribute_values(*name, value.clone());
            }
            let out = request
                .send()
                .await
                .map_err(|e| from_sdk("outbox admin query", e))?;
            self.record_capacity(&self.inner.metrics.admin_units, out.consumed_capacity());
            total += u64::try_from(out.count()).unwrap_or(0);
            if !q.count_only {
                for entry in out.items.unwrap_or_default() {
                    if !visit(entry) {
                        return Ok(total);
                    }
                }
            }
            match out.last_evaluated_key {
                Some(key) => start = Some(key),
                None => return Ok(total),
            }
        }
    }

    /// Every shard's dead letters matching `filter`, past `after` in `order`, at most
    /// `limit` of them in that order.
    async fn matching_dead(
        &self,
        filter: &DeadLetterFilter,
        after: Option<MessageId>,
        order: DeadLetterOrder,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let forward = order == DeadLetterOrder::Ascending;
        let mut condition = format!("#{SHARD} = :pk");
        let mut values = Vec::new();
        if let Some(after) = after {
            condition.push_str(&format!(
                " AND #{DEAD_ID} {} :after",
                if forward { ">" } else { "<" }
            ));
            values.push((":after", s(id_text(after))));
        }
        let q = IndexQuery {
            index: DEAD_INDEX,
            condition,
            values,
            forward,
            count_only: false,
        };
        let now = SystemTime::now();
        let per_shard: Vec<Vec<DeadLetter>> = bounded(
            (0..self.table_shards().await?.shards)
                .map(|shard| {
                    let q = q.clone();
                    async move {
                        let mut found = Vec::new();
                        self.query_shard(shard, &q, |entry| {
                            if let Some(letter) = dead_letter(&entry) {
                                if filter.matches(&letter, now) {
                                    found.push(letter);
                                }
                            }
                            found.len() < limit
                        })
                        .await?;
                        Ok::<_, outbox_core::Error>(found)
                    }
                })
                .collect(),
        )
        .await?;
        let mut all: Vec<DeadLetter> = per_shard.into_iter().flatten().collect();
        all.sort_by_key(|l| l.message.id);
        if !forward {
            all.reverse();
        }
        all.truncate(limit);
        Ok(all)
    }

    /// `letter` with what its body holds: the state item read strongly consistent (for
    /// the part count and the latest error), then the body items.
    async fn with_body(&self, letter: DeadLetter) -> Result<DeadLetter> {
        let Some(state) = self.read(letter.message.id).await? else {
            return Ok(letter);
        };
        let body = self.read_body(letter.message.id, &state).await?;
        Ok(match decode_lossy(&state, &body) {
            Some(message) => DeadLetter::new(message, letter.dead_at),
            None => letter,
        })
    }

    async fn selected(&self, selection: &DeadLetterSelection) -> Result<Vec<MessageId>> {
        Ok(match dead_target(selection)? {
            None => Vec::new(),
            Some(DeadTarget::Ids(ids)) => ids,
            Some(DeadTarget::Matching { filter, limit }) => self
                .matching_dead(filter, None, DeadLetterOrder::Ascending, limit)
                .await?
                .into_iter()
                .map(|l| l.message.id)
                .collect(),
        })
    }

    /// Delete message `id`'s state item while it has `attribute`; with `bodies`, then
    /// its body items too (a dead letter's body has no time to live).
    pub(crate) async fn delete_if(
        &self,
        id: MessageId,
        attribute: &str,
        what: &str,
        bodies: bool,
    ) -> Result<bool> {
        let condition = format!("attribute_exists(#{attribute})");
        let sent = self
            .inner
            .client
            .delete_item()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .set_expression_attribute_names(Some(item::names(&[&condition])))
            .condition_expression(condition)
            .return_values(ReturnValue::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record_capacity(&self.inner.metrics.admin_units, out.consumed_capacity());
                if bodies {
                    let old = out.attributes.unwrap_or_default();
                    let parts = get_n::<usize>(&old, PARTS).ok().flatten().unwrap_or(1);
                    let deletes: Vec<_> = (0..parts)
                        .map(|part| async move {
                            self.inner
                                .client
                                .delete_item()
                                .table_name(self.table())
                                .set_key(Some(body_key(id, part)))
                                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                                .send()
                                .await
                                .map(|out| {
                                    self.record_capacity(
                                        &self.inner.metrics.admin_units,
                                        out.consumed_capacity(),
                                    );
                                })
                                .map_err(|e| from_sdk(what, e))
                        })
                        .collect();
                    if let Err(e) = bounded(deletes).await {
                        tracing::warn!(%id, error = %e.report(), "discarded dead letter's body left behind");
                    }
                }
                Ok(true)
            }
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(from_sdk(what, e)),
        }
    }

    async fn for_each_id<F, Fut>(&self, ids: Vec<MessageId>, f: F) -> Result<u64>
    where
        F: Fn(MessageId) -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let done: Vec<bool> = bounded(ids.into_iter().map(f).collect()).await?;
        Ok(done.into_iter().filter(|d| *d).count() as u64)
    }

    fn dispatched_query(&self, older_than: Duration, count_only: bool) -> IndexQuery {
        let cutoff = now_us().saturating_sub(item::duration_us(older_than));
        IndexQuery {
            index: DONE_INDEX,
            condition: format!("#{SHARD} = :pk AND #{DONE_AT} < :cutoff"),
            values: vec![(":cutoff", n(cutoff))],
            forward: true,
            count_only,
        }
    }

    fn keeps_history(&self) -> bool {
        matches!(
            self.inner.config.capabilities().retention,
            Retention::Keep { .. }
        )
    }
}

/// A dead letter as its state item tells it: no payload, headers or content type
/// until `with_body` reads its body.
fn dead_letter(entry: &Item) -> Option<DeadLetter> {
    let message = decode_lossy(entry, &[])?;
    let dead_at = get_n::<u64>(entry, DEAD_AT).ok().flatten().unwrap_or(0);
    Some(DeadLetter::new(message, item::from_micros(dead_at)))
}

#[async_trait]
impl OutboxAdmin for DynamoOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        let now = now_us();
        let due = IndexQuery {
            index: DUE_INDEX,
            condition: format!("#{SHARD} = :pk"),
            values: vec![],
            forward: true,
            count_only: false,
        };
        let dead = IndexQuery {
            index: DEAD_INDEX,
            condition: format!("#{SHARD} = :pk"),
            values: vec![],
            forward: true,
            count_only: true,
        };
        let done = IndexQuery {
            index: DONE_INDEX,
            ..dead.clone()
        };
        let per_shard: Vec<(u64, u64, Option<u64>, u64, u64)> = bounded(
            (0..self.table_shards().await?.shards)
                .map(|shard| {
                    let (due, dead, done) = (&due, &dead, &done);
                    async move {
                        let (mut pending, mut in_flight, mut oldest) = (0u64, 0u64, None::<u64>);
                        self.query_shard(shard, due, |entry| {
                            let available = get_n::<u128>(&entry, DUE)
                                .ok()
                                .flatten()
                                .map_or(0, |d| d / DUE_SCALE);
                            if entry.contains_key(TOKEN) && available > u128::from(now) {
                                in_flight += 1;
                            } else {
                                pending += 1;
                            }
                            if let Ok(Some(created)) = get_n::<u64>(&entry, CREATED) {
                                oldest = Some(oldest.map_or(created, |o| o.min(created)));
                            }
                            true
                        })
                        .await?;
                        let dead = self.query_shard(shard, dead, |_| true).await?;
                        let done = if self.keeps_history() {
                            self.query_shard(shard, done, |_| true).await?
                        } else {
                            0
                        };
                        Ok::<_, outbox_core::Error>((pending, in_flight, oldest, dead, done))
                    }
                })
                .collect(),
        )
        .await?;
        let (mut pending, mut in_flight, mut oldest, mut dead, mut done) = (0, 0, None, 0, 0);
        for (p, f, o, d, k) in per_shard {
            pending += p;
            in_flight += f;
            dead += d;
            done += k;
            oldest = match (oldest, o) {
                (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
                (a, b) => a.or(b),
            };
        }
        let age = oldest.map(|created: u64| Duration::from_micros(now.saturating_sub(created)));
        Ok(OutboxStats::new(pending, in_flight, dead, done, age))
    }

    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        let listed = self
            .matching_dead(page.filter(), page.after_id(), page.order(), page.limit())
            .await?;
        bounded(listed.into_iter().map(|l| self.with_body(l)).collect()).await
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let all = self
            .matching_dead(filter, None, DeadLetterOrder::Ascending, usize::MAX)
            .await?;
        Ok(all.len() as u64)
    }

    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        let ids = self.selected(selection).await?;
        self.for_each_id(ids, |id| self.requeue_one(id)).await
    }

    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        let ids = self.selected(selection).await?;
        self.for_each_id(ids, |id| self.discard_one(id)).await
    }

    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let Some(limit) = purge_limit(limit, self.inner.config.capabilities().retention) else {
            return Ok(0);
        };
        let q = self.dispatched_query(older_than, false);
        let per_shard: Vec<Vec<(u64, MessageId)>> = bounded(
            (0..self.table_shards().await?.shards)
                .map(|shard| {
                    let q = q.clone();
                    async move {
                        let mut found = Vec::new();
                        self.query_shard(shard, &q, |entry| {
                            if let (Ok(Some(at)), Some(id)) =
                                (get_n::<u64>(&entry, DONE_AT), item::candidate_id(&entry))
                            {
                                found.push((at, id));
                            }
                            found.len() < limit
                        })
                        .await?;
                        Ok::<_, outbox_core::Error>(found)
                    }
                })
                .collect(),
        )
        .await?;
        let mut oldest: Vec<(u64, MessageId)> = per_shard.into_iter().flatten().collect();
        oldest.sort();
        oldest.truncate(limit);
        let ids = oldest.into_iter().map(|(_, id)| id).collect();
        self.for_each_id(ids, |id| {
            self.delete_if(id, DONE_AT, "purge dispatched", false)
        })
        .await
    }

    async fn count_dispatched(&self, older_than: Duration) -> Result<u64> {
        if !self.keeps_history() {
            return Ok(0);
        }
        let q = self.dispatched_query(older_than, true);
        let counts: Vec<u64> = bounded(
            (0..self.table_shards().await?.shards)
                .map(|shard| {
                    let q = &q;
                    async move { self.query_shard(shard, q, |_| true).await }
                })
                .collect(),
        )
        .await?;
        Ok(counts.into_iter().sum())
    }
}
