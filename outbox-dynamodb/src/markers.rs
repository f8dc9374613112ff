//! Order markers that cannot be lost: every write that could race a requeue is a
//! transaction whose condition looks at the message item.
//!
//! A marker says "message `mid` holds this place in its key's order": one small item
//! ([`marker_item`]), written by the enqueue transaction. Three writes touch markers
//! after enqueue:
//!
//! 1. **Requeue** of a dead letter sets the message undelivered and puts its marker back
//!    in one `TransactWriteItems` (update conditional on `attribute_exists(dead_id)`,
//!    then the put): a claim never sees the message undelivered without its marker.
//! 2. **Removal of a stale marker** (its message delivered or dead) during a claim's
//!    head check, and removal after **dead-lettering**, are a `TransactWriteItems` of a
//!    condition check on the message (`attribute_not_exists(due)`: not undelivered,
//!    deleted counts) and the marker delete. A requeue that committed in between makes
//!    the check fail and the marker stays.
//! 3. Removal after **complete** stays a plain delete: a completed message is deleted
//!    or kept as done, and neither can be requeued, so nothing can revive its marker.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConditionCheck, Delete, ReturnConsumedCapacity, TransactWriteItem};
use outbox_core::{MessageId, Result};

use crate::error::{build_error, cancelled, from_sdk, reason_codes};
use crate::item::{
    self, id_text, marker_partition, marker_prefix, s, shard_of, Item, DUE, MARKED_ID, PK, SK,
};
use crate::metrics::Metrics;
use crate::store::DynamoOutbox;

/// The order marker of message `id` (enqueue sequence `seq`) of `key`, in the marker
/// partition the key falls in among `key_shards`.
pub(crate) fn marker_item(key_shards: u16, key: &str, seq: u64, id: MessageId) -> Item {
    let shard = shard_of(&[key.as_bytes()], key_shards);
    HashMap::from([
        (PK.to_owned(), s(marker_partition(shard))),
        (
            SK.to_owned(),
            s(format!("{}{seq:016}#{}", marker_prefix(key), id_text(id))),
        ),
        (MARKED_ID.to_owned(), s(id_text(id))),
    ])
}

/// How a transaction of [`DynamoOutbox::transact`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transacted {
    /// Every action was applied.
    Applied,
    /// Nothing was applied: the conditions of these actions (by index) failed, and
    /// nothing else cancelled it.
    Refused(Vec<usize>),
}

impl DynamoOutbox {
    /// Send `actions` as one transaction, adding the capacity it consumed to `units`:
    /// [`Transacted::Applied`], or [`Transacted::Refused`] with the actions whose
    /// condition failed when that alone cancelled it; an error for anything else.
    pub(crate) async fn transact(
        &self,
        what: &str,
        actions: Vec<TransactWriteItem>,
        units: &AtomicU64,
    ) -> Result<Transacted> {
        let sent = self
            .inner
            .client
            .transact_write_items()
            .set_transact_items(Some(actions))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        let e = match sent {
            Ok(out) => {
                Metrics::add_all(units, out.consumed_capacity());
                return Ok(Transacted::Applied);
            }
            Err(e) => e,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(c)) = e.as_service_error()
        else {
            return Err(from_sdk(what, e));
        };
        let reasons = reason_codes(c.cancellation_reasons());
        let failed: Vec<usize> = reasons
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_some())
            .map(|(i, _)| i)
            .collect();
        if !failed.is_empty()
            && reasons
                .iter()
                .all(|r| r.is_none_or(|code| code == "ConditionalCheckFailed"))
        {
            return Ok(Transacted::Refused(failed));
        }
        let owned: Vec<Option<String>> =
            reasons.into_iter().map(|r| r.map(str::to_owned)).collect();
        let refs: Vec<Option<&str>> = owned.iter().map(|r| r.as_deref()).collect();
        Err(cancelled(what, &refs, e))
    }

    /// [`transact`](Self::transact), `Ok(false)` when it was cancelled only because the
    /// condition of action `condition_at` failed.
    pub(crate) async fn transact_if(
        &self,
        what: &str,
        actions: Vec<TransactWriteItem>,
        condition_at: usize,
        units: &AtomicU64,
    ) -> Result<bool> {
        match self.transact(what, actions, units).await? {
            Transacted::Applied => Ok(true),
            Transacted::Refused(failed) if failed == [condition_at] => Ok(false),
            Transacted::Refused(failed) => {
                let reasons: Vec<Option<&str>> = (0..=failed.iter().copied().max().unwrap_or(0))
                    .map(|i| failed.contains(&i).then_some("ConditionalCheckFailed"))
                    .collect();
                Err(cancelled(
                    what,
                    &reasons,
                    format!("conditions of actions {failed:?} failed"),
                ))
            }
        }
    }

    /// Delete the marker at `marker_key` only while message `id` is not undelivered;
    /// `Ok(false)` when the message is undelivered (requeued since) and the marker stays.
    pub(crate) async fn delete_marker_if_settled(
        &self,
        marker_key: Item,
        id: MessageId,
    ) -> Result<bool> {
        let condition = format!("attribute_not_exists(#{DUE})");
        let check = ConditionCheck::builder()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .set_expression_attribute_names(Some(item::names(&[&condition])))
            .condition_expression(condition)
            .build()
            .map_err(|e| build_error("delete order marker", e))?;
        let delete = Delete::builder()
            .table_name(self.table())
            .set_key(Some(marker_key))
            .build()
            .map_err(|e| build_error("delete order marker", e))?;
        self.transact_if(
            "delete order marker",
            vec![
                TransactWriteItem::builder().condition_check(check).build(),
                TransactWriteItem::builder().delete(delete).build(),
            ],
            0,
            &self.inner.metrics.settle_units,
        )
        .await
    }
}
