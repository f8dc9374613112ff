//! Dead-lettering: the state item leaves the `due` index for the `dead` one and every
//! body item loses its time to live, in one `TransactWriteItems`, so a dead letter never
//! keeps a body that expires under it. (As two writes, a failed second one left the body
//! to expire days later, and the dead letter with nothing to requeue.) The transaction
//! bills the body items twice, as every transactional write is billed: dead-lettering is
//! rare, and what it buys is the dead letter's payload.
//!
//! A message whose body is incomplete (a poison message dead-lettered by the claim that
//! found a part missing) cancels the transaction on the missing part's condition; it is
//! then dead-lettered with the state write alone and the time to live removed from the
//! parts that exist.

use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::{ReturnValue, TransactWriteItem, Update};
use outbox_core::{store::Lease, Result};

use crate::error::build_error;
use crate::item::{
    self, body_key, get_n, id_text, n, now_us, s, Item, DEAD_AT, DEAD_ID, LAST_ERROR, PARTS, PK,
    TTL,
};
use crate::markers::Transacted;
use crate::settle::BodyTtl;
use crate::store::DynamoOutbox;

/// The state update of a dead-lettering, as an expression and its values.
fn dead_letter_update(
    lease: &Lease,
    reason: &str,
) -> (
    String,
    Vec<(&'static str, aws_sdk_dynamodb::types::AttributeValue)>,
) {
    (
        format!(
            "SET #{DEAD_AT} = :now, #{DEAD_ID} = :id, #{LAST_ERROR} = :error REMOVE #due, #token"
        ),
        vec![
            (":now", n(now_us())),
            (":id", s(id_text(lease.id))),
            (":error", s(reason)),
        ],
    )
}

impl DynamoOutbox {
    /// Dead-letter a message under `lease` with `reason`: out of the due index, into
    /// the dead one, its body kept (see the module docs). The lease fences it; whether
    /// it was applied.
    pub(crate) async fn dead_letter(&self, lease: &Lease, reason: &str) -> Result<bool> {
        // How many body items; the transaction's fence decides, not this read.
        let Some(state) = self.read(lease.id).await? else {
            self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        };
        let parts = get_n::<usize>(&state, PARTS).ok().flatten().unwrap_or(1);
        if parts + 1 > crate::MAX_TRANSACTION_ACTIONS {
            return self.dead_letter_apart(lease, reason).await;
        }
        let (update, values) = dead_letter_update(lease, reason);
        let condition = "#token = :token AND attribute_exists(#due)";
        let mut message = Update::builder()
            .table_name(self.table())
            .set_key(Some(self.key_of(lease.id)))
            .set_expression_attribute_names(Some(item::names(&[&update, condition])))
            .update_expression(update)
            .condition_expression(condition)
            .expression_attribute_values(":token", s(lease.token.as_uuid().to_string()));
        for (name, value) in values {
            message = message.expression_attribute_values(name, value);
        }
        let mut actions = vec![TransactWriteItem::builder()
            .update(message.build().map_err(|e| build_error("dead-letter", e))?)
            .build()];
        for part in 0..parts {
            let body = Update::builder()
                .table_name(self.table())
                .set_key(Some(body_key(lease.id, part)))
                .update_expression("REMOVE #ttl")
                .condition_expression("attribute_exists(#pk)")
                .expression_attribute_names("#ttl", TTL)
                .expression_attribute_names("#pk", PK)
                .build()
                .map_err(|e| build_error("dead-letter", e))?;
            actions.push(TransactWriteItem::builder().update(body).build());
        }
        match self
            .transact("dead-letter", actions, &self.inner.metrics.settle_units)
            .await?
        {
            Transacted::Applied => {
                self.forget_marker(&state, true).await;
                Ok(true)
            }
            // The fence: another lease holds the message, or it was settled.
            Transacted::Refused(failed) if failed.contains(&0) => {
                self.inner.metrics.refused.fetch_add(1, Ordering::Relaxed);
                Ok(false)
            }
            // Only body parts are missing.
            Transacted::Refused(_) => self.dead_letter_apart(lease, reason).await,
        }
    }

    /// Dead-letter with the state write alone, then remove the time to live of the
    /// body items that exist (best effort: a body this incomplete does not decode, so
    /// what is kept is for the operator to read).
    async fn dead_letter_apart(&self, lease: &Lease, reason: &str) -> Result<bool> {
        let (update, values) = dead_letter_update(lease, reason);
        let done: Option<Item> = self
            .fenced_update(
                "dead-letter",
                lease,
                update,
                values,
                "",
                ReturnValue::AllNew,
            )
            .await?;
        if let Some(item) = &done {
            self.forget_marker(item, true).await;
            let parts = get_n::<usize>(item, PARTS).ok().flatten().unwrap_or(1);
            if let Err(e) = self.set_body_ttl(lease.id, parts, BodyTtl::Remove).await {
                tracing::warn!(id = %lease.id, error = %e.report(), "dead letter's body keeps its time to live");
            }
        }
        Ok(done.is_some())
    }
}
