//! Settles of [`DynamoOutbox`]: fail (a retry, or dead-lettering by `dead_letter.rs`)
//! and release, each a conditional write fenced on `token = :token AND
//! attribute_exists(due)`, and what every settle shares: the fenced update, running a
//! batch of settles ([`all_settled`]), body time-to-live writes and the removal of a
//! settled message's order marker. Completes are in `complete.rs`.

use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::{ReturnConsumedCapacity, ReturnValue};
use outbox_core::backend::in_id_order;
use outbox_core::{
    store::Disposition, store::Failure, store::Lease, store::Settled, MessageId, Result,
};

use crate::concurrency::{bounded, bounded_all};
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{
    self, body_key, get_n, get_s, n, now_us, s, Item, ATTEMPTS, AVAILABLE, DUE_SCALE, LAST_ERROR,
    PARTITION_KEY, PK, SEQ, SK, TTL,
};
use crate::metrics::Metrics;
use crate::store::DynamoOutbox;

/// What [`DynamoOutbox::set_body_ttl`] writes on each body item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyTtl {
    /// Remove the time to live: a dead letter keeps its body until it is discarded.
    Remove,
    /// Set it to this epoch second (a requeue gives the body its time to live back).
    Set(u64),
    /// Push it out to `at` (epoch seconds), only on an item whose time to live is
    /// below `need` (`need` < `at`). Only an item that has one: a renewal racing a
    /// dead-lettering never gives the dead letter's body a time to live again
    /// (dead-lettering removes it after writing the state item). Below `need`, not
    /// below `at`: of two renewers racing (each with its own, slightly later `at`),
    /// the second finds the first's `at` past its `need` and is refused, instead of
    /// writing the body again; and no renewal ever shortens it.
    Renew {
        /// The new time to live.
        at: u64,
        /// The time to live below which the item needs renewing.
        need: u64,
        /// Whether the write waits for and is charged to the store's
        /// [renewal budget](crate::DynamoOutboxConfig::with_renewal_budget) (the
        /// sweep's renewals).
        paced: bool,
    },
}

/// The settles' `results` when every one succeeded; otherwise, after counting the
/// failures in `settle_errors`, the first failure (every settle was attempted: a retry
/// of the call finds the ones applied reported lost, as after any ambiguous settle).
pub(crate) fn all_settled<T>(metrics: &Metrics, results: Vec<Result<T>>) -> Result<Vec<T>> {
    let failed = results.iter().filter(|r| r.is_err()).count();
    if failed > 0 {
        metrics
            .settle_errors
            .fetch_add(u64::try_from(failed).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    results.into_iter().collect()
}

impl DynamoOutbox {
    /// Remove the order marker of a message that left the undelivered state (delivered
    /// or dead), from the item as it was. Best effort: a marker left behind by a crash
    /// here is found stale and removed by the next head check of its key. `guarded`
    /// (after dead-lettering, which a requeue can undo) makes the delete conditional on
    /// the message still not being undelivered (see `markers.rs`).
    pub(crate) async fn forget_marker(&self, item: &Item, guarded: bool) {
        if !self.per_key() {
            return;
        }
        let (Some(key), Ok(Some(seq)), Some(id)) = (
            get_s(item, PARTITION_KEY),
            get_n::<u64>(item, SEQ),
            item::candidate_id(item),
        ) else {
            return;
        };
        let key_shards = match self.table_shards().await {
            Ok(table) => table.key_shards,
            Err(e) => {
                tracing::warn!(%id, error = %e.report(), "order marker left: the table's shard count was not read; the next claim of its key removes it");
                return;
            }
        };
        let marker = crate::markers::marker_item(key_shards, key, seq, id);
        let key: Item = marker
            .into_iter()
            .filter(|(k, _)| k == PK || k == SK)
            .collect();
        let removed = if guarded {
            self.delete_marker_if_settled(key, id).await.map(|_| ())
        } else {
            self.inner
                .client
                .delete_item()
                .table_name(self.table())
                .set_key(Some(key))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map(|out| {
                    self.record_capacity(&self.inner.metrics.settle_units, out.consumed_capacity());
                })
                .map_err(|e| from_sdk("delete order marker", e))
        };
        if let Err(e) = removed {
            tracing::warn!(error = %e.report(), "order marker left behind");
        }
    }

    /// Write the time to live of the `parts` body items of message `id` (see
    /// [`BodyTtl`]); a missing item is left missing. Returns how many items were
    /// written (the others refused the condition). Each write, refused or not, is
    /// billed at the body item's size: only dead-lettering, requeues and renewals of
    /// messages that stay undelivered long come here.
    pub(crate) async fn set_body_ttl(
        &self,
        id: MessageId,
        parts: usize,
        ttl: BodyTtl,
    ) -> Result<usize> {
        let futures: Vec<_> = (0..parts)
            .map(|part| async move {
                let mut request = self
                    .inner
                    .client
                    .update_item()
                    .table_name(self.table())
                    .set_key(Some(body_key(id, part)))
                    .expression_attribute_names("#ttl", TTL)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total);
                request = match ttl {
                    BodyTtl::Remove => request
                        .update_expression("REMOVE #ttl")
                        .condition_expression("attribute_exists(#pk)")
                        .expression_attribute_names("#pk", PK),
                    BodyTtl::Set(at) => request
                        .update_expression("SET #ttl = :ttl")
                        .condition_expression("attribute_exists(#pk)")
                        .expression_attribute_names("#pk", PK)
                        .expression_attribute_values(":ttl", n(at)),
                    BodyTtl::Renew { at, need, .. } => request
                        .update_expression("SET #ttl = :ttl")
                        .condition_expression("#ttl < :need")
                        .expression_attribute_values(":ttl", n(at))
                        .expression_attribute_values(":need", n(need)),
                };
                let renewal = matches!(ttl, BodyTtl::Renew { .. });
                // Dead-lettering removes the time to live, a requeue sets it.
                let units = match ttl {
                    BodyTtl::Renew { .. } => &self.inner.metrics.renewal_units,
                    BodyTtl::Remove => &self.inner.metrics.settle_units,
                    BodyTtl::Set(_) => &self.inner.metrics.admin_units,
                };
                let paced = matches!(ttl, BodyTtl::Renew { paced: true, .. });
                if paced {
                    self.renewal_budget_ready().await;
                }
                match request.send().await {
                    Ok(out) => {
                        self.record_capacity(units, out.consumed_capacity());
                        if paced {
                            self.charge_renewal(out.consumed_capacity());
                        }
                        Ok(true)
                    }
                    Err(e) if is_condition_failed(&e) => {
                        if renewal {
                            self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false)
                    }
                    Err(e) => Err(from_sdk("body time to live", e)),
                }
            })
            .collect();
        let written: Vec<bool> = bounded(futures).await?;
        Ok(written.into_iter().filter(|w| *w).count())
    }

    /// Run `settle` for every lease in id order, at most
    /// [`CONCURRENCY`](crate::concurrency::CONCURRENCY) at once, and reconcile the ids it
    /// applied. One failed settle stops none of the others; the call then returns the
    /// first failure (see [`all_settled`]).
    pub(crate) async fn settle_all<'a, T, F, Fut>(
        &'a self,
        items: &'a [T],
        id: impl Fn(&T) -> MessageId,
        settle: F,
    ) -> Result<Settled>
    where
        F: Fn(&'a T) -> Fut,
        Fut: std::future::Future<Output = Result<bool>> + 'a,
    {
        let ordered = in_id_order(items, &id);
        let futures: Vec<_> = ordered
            .into_iter()
            .map(|t| {
                let fut = settle(t);
                let i = id(t);
                async move { fut.await.map(|ok| ok.then_some(i)) }
            })
            .collect();
        let results = bounded_all(futures).await;
        let applied: Vec<MessageId> = all_settled(&self.inner.metrics, results)?
            .into_iter()
            .flatten()
            .collect();
        Ok(Settled::reconcile(items.iter().map(id), applied))
    }

    /// One fenced update: applied unless the condition (token and undelivered) failed.
    pub(crate) async fn fenced_update(
        &self,
        what: &str,
        lease: &Lease,
        update: String,
        values: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
        extra_condition: &str,
        returned: ReturnValue,
    ) -> Result<Option<Item>> {
        let condition = format!("#token = :token AND attribute_exists(#due){extra_condition}");
        let mut request = self
            .inner
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(self.key_of(lease.id)))
            .set_expression_attribute_names(Some(item::names(&[&update, &condition])))
            .update_expression(update)
            .condition_expression(condition)
            .expression_attribute_values(":token", s(lease.token.as_uuid().to_string()))
            .return_values(returned)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        for (name, value) in values {
            request = request.expression_attribute_values(name, value);
        }
        match request.send().await {
            Ok(out) => {
                self.record_capacity(&self.inner.metrics.settle_units, out.consumed_capacity());
                Ok(Some(out.attributes.unwrap_or_default()))
            }
            Err(e) if is_condition_failed(&e) => {
                self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(from_sdk(what, e)),
        }
    }

    pub(crate) async fn fail_one(&self, failure: &Failure) -> Result<bool> {
        let lease = failure.lease();
        match failure.disposition() {
            Disposition::DeadLetter => self.dead_letter(lease, failure.error()).await,
            Disposition::Retry { after } => {
                let at = now_us().saturating_add(item::duration_us(after));
                let done = self
                    .fenced_update(
                        "fail",
                        lease,
                        format!(
                            "SET #{AVAILABLE} = :at, #due = :base + #{SEQ}, \
                             #{LAST_ERROR} = :error REMOVE #token"
                        ),
                        vec![
                            (":at", n(at)),
                            (":base", n(u128::from(at) * DUE_SCALE)),
                            (":error", s(failure.error())),
                        ],
                        "",
                        ReturnValue::AllNew,
                    )
                    .await?;
                if let Some(item) = &done {
                    // A long backoff must not outlast the body.
                    self.keep_state_body_ahead(lease.id, item, at).await;
                }
                Ok(done.is_some())
            }
        }
    }

    pub(crate) async fn release_one(&self, lease: &Lease) -> Result<bool> {
        let now = now_us();
        let values = || {
            vec![
                (":at", n(now)),
                (":base", n(u128::from(now) * DUE_SCALE)),
                (":one", n(1)),
            ]
        };
        let set = format!("SET #{AVAILABLE} = :at, #due = :base + #{SEQ}");
        let done = self
            .fenced_update(
                "release",
                lease,
                format!("{set}, #{ATTEMPTS} = #{ATTEMPTS} - :one REMOVE #token"),
                values(),
                &format!(" AND #{ATTEMPTS} >= :one"),
                ReturnValue::AllNew,
            )
            .await?;
        if let Some(item) = &done {
            self.keep_state_body_ahead(lease.id, item, now).await;
            return Ok(true);
        }
        // The count was already 0 (a message written by another tool): release it
        // without taking anything back.
        let done = self
            .fenced_update(
                "release",
                lease,
                format!("{set} REMOVE #token"),
                values(),
                &format!(" AND #{ATTEMPTS} < :one"),
                ReturnValue::AllNew,
            )
            .await?;
        if let Some(item) = &done {
            self.keep_state_body_ahead(lease.id, item, now).await;
        }
        Ok(done.is_some())
    }
}
