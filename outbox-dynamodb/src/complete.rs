//! Completes of [`DynamoOutbox`], fenced like every settle (`token = :token AND
//! attribute_exists(due)`): under `Retention::Keep` an update that marks the message
//! done; under `Retention::Delete` a delete of its state item, sent as PartiQL
//! `BatchExecuteStatement`s of up to [`MAX_BATCH_STATEMENTS`] unless per-key order
//! needs each deleted item back (for its order marker).

use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::{
    BatchStatementErrorCodeEnum, BatchStatementRequest, ReturnConsumedCapacity, ReturnValue,
};
use outbox_core::backend::in_id_order;
use outbox_core::{store::Lease, store::Settled, MessageId, Result, Retention};

use crate::concurrency::bounded_all;
use crate::error::{build_error, from_sdk, is_condition_failed};
use crate::item::{n, now_us, s, DONE_AT, DUE, PK, SK, TOKEN};
use crate::settle::all_settled;
use crate::store::DynamoOutbox;

/// Most statements in one `BatchExecuteStatement` (DynamoDB's limit).
const MAX_BATCH_STATEMENTS: usize = 25;

impl DynamoOutbox {
    /// Complete `leases` ([`OutboxStore::complete`](outbox_core::OutboxStore::complete)).
    /// Under `Retention::Delete` without per-key order, in id order, in
    /// [`delete_batch`](Self::delete_batch)es of up to [`MAX_BATCH_STATEMENTS`] (at most
    /// [`CONCURRENCY`](crate::concurrency::CONCURRENCY) at once); otherwise one
    /// [`complete_one`](Self::complete_one) per lease through
    /// [`settle_all`](Self::settle_all).
    pub(crate) async fn complete_leases(&self, leases: &[Lease]) -> Result<Settled> {
        if self.per_key() || self.inner.config.capabilities().retention != Retention::Delete {
            return self
                .settle_all(leases, |l| l.id, |l| self.complete_one(l))
                .await;
        }
        let ordered: Vec<Lease> = in_id_order(leases, |l| l.id).into_iter().copied().collect();
        let chunks: Vec<_> = ordered
            .chunks(MAX_BATCH_STATEMENTS)
            .map(|chunk| self.delete_batch(chunk))
            .collect();
        let applied: Vec<MessageId> = bounded_all(chunks)
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        Ok(Settled::reconcile(leases.iter().map(|l| l.id), applied))
    }

    /// Complete up to [`MAX_BATCH_STATEMENTS`] leases under `Retention::Delete` with one
    /// `BatchExecuteStatement`: each statement is its own conditional delete (the same
    /// fence as [`complete_one`](Self::complete_one), one write unit each, not a
    /// transaction), so a lost lease fails alone. Statements failing for another reason
    /// (throttling) are retried one by one, all of them even when one of those fails.
    /// Returns the ids applied, or the first failure.
    ///
    /// A PartiQL `DELETE` whose key matches no item succeeds with nothing deleted; only
    /// an item that exists and fails the `WHERE` gives `ConditionalCheckFailed`. So each
    /// statement returns the item it deleted (`RETURNING ALL OLD *`, which costs no
    /// extra capacity), and a statement that succeeded without one found its message
    /// gone: another claimer took the lapsed lease over and completed it. That lease is
    /// lost, as the fence says, not applied.
    async fn delete_batch(&self, leases: &[Lease]) -> Result<Vec<MessageId>> {
        let statement = format!(
            "DELETE FROM \"{}\" WHERE \"{PK}\" = ? AND \"{SK}\" = ? AND \"{TOKEN}\" = ? \
             AND \"{DUE}\" IS NOT MISSING RETURNING ALL OLD *",
            self.table()
        );
        let mut requests = Vec::with_capacity(leases.len());
        for lease in leases {
            let key = self.key_of(lease.id);
            requests.push(
                BatchStatementRequest::builder()
                    .statement(&statement)
                    .parameters(key[PK].clone())
                    .parameters(key[SK].clone())
                    .parameters(s(lease.token.as_uuid().to_string()))
                    .build()
                    .map_err(|e| build_error("complete", e))?,
            );
        }
        let out = self
            .inner
            .client
            .batch_execute_statement()
            .set_statements(Some(requests))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| {
                let count = u64::try_from(leases.len()).unwrap_or(u64::MAX);
                self.inner
                    .metrics
                    .settle_errors
                    .fetch_add(count, Ordering::Relaxed);
                from_sdk("complete", e)
            })?;
        let reported = !out.consumed_capacity().is_empty();
        for c in out.consumed_capacity() {
            self.record_capacity(&self.inner.metrics.settle_units, Some(c));
        }
        let mut applied = Vec::with_capacity(leases.len());
        let mut retried = Vec::new();
        for (lease, response) in leases.iter().zip(out.responses()) {
            match response.error().and_then(|e| e.code()) {
                None if response.item().is_none() => {
                    // Nothing was deleted: the message is gone, settled under another
                    // lease. In effect a refused write, and counted as one.
                    self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    if !reported {
                        // DynamoDB Local returns no consumed capacity for PartiQL
                        // batches: count what DynamoDB bills, one unit for the state
                        // item (under 1 KB) and one for its `due` index entry.
                        self.inner
                            .metrics
                            .settle_units
                            .fetch_add(2 * crate::metrics::UNIT, Ordering::Relaxed);
                    }
                    applied.push(lease.id);
                }
                Some(BatchStatementErrorCodeEnum::ConditionalCheckFailed) => {
                    self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => retried.push(lease),
            }
        }
        let results = bounded_all(retried.iter().map(|l| self.complete_one(l)).collect()).await;
        for (lease, done) in retried
            .iter()
            .zip(all_settled(&self.inner.metrics, results)?)
        {
            if done {
                applied.push(lease.id);
            }
        }
        Ok(applied)
    }

    async fn complete_one(&self, lease: &Lease) -> Result<bool> {
        match self.inner.config.capabilities().retention {
            Retention::Keep { .. } => {
                let done = self
                    .fenced_update(
                        "complete",
                        lease,
                        format!("SET #{DONE_AT} = :now REMOVE #due, #token"),
                        vec![(":now", n(now_us()))],
                        "",
                        self.settle_return(),
                    )
                    .await?;
                if let Some(item) = &done {
                    self.forget_marker(item, false).await;
                }
                Ok(done.is_some())
            }
            Retention::Delete => {
                let sent = self
                    .inner
                    .client
                    .delete_item()
                    .table_name(self.table())
                    .set_key(Some(self.key_of(lease.id)))
                    .condition_expression("#token = :token AND attribute_exists(#due)")
                    .expression_attribute_names("#token", TOKEN)
                    .expression_attribute_names("#due", DUE)
                    .expression_attribute_values(":token", s(lease.token.as_uuid().to_string()))
                    .return_values(if self.per_key() {
                        ReturnValue::AllOld
                    } else {
                        ReturnValue::None
                    })
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await;
                match sent {
                    Ok(out) => {
                        self.record_capacity(
                            &self.inner.metrics.settle_units,
                            out.consumed_capacity(),
                        );
                        self.forget_marker(&out.attributes.unwrap_or_default(), false)
                            .await;
                        Ok(true)
                    }
                    Err(e) if is_condition_failed(&e) => {
                        self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                        Ok(false)
                    }
                    Err(e) => Err(from_sdk("complete", e)),
                }
            }
        }
    }
}
