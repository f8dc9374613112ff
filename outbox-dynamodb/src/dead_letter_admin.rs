//! What an operator does to one dead letter: requeue it or discard it, each one
//! `TransactWriteItems` of the state item and every body item, so neither leaves a
//! body behind that outlives its message or expires under it.
//!
//! As separate writes, a requeue whose body write failed left an undelivered
//! message's body without a time to live (kept forever once delivered), and a discard
//! whose body deletes failed left orphan bodies nothing would ever delete. The
//! transactions bill the body items twice, as every transactional write is billed;
//! requeues and discards are operator actions, and what they buy is a table that
//! holds no body without a message and no message without its body's lifetime.
//!
//! A requeue whose body has a part missing (a poison message the claim dead-lettered
//! for it) is cancelled on that part's condition; it then goes back with the state
//! write (and its order marker) alone, and the parts that exist get their time to
//! live set after it, best effort: the next claim dead-letters it again.

use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};
use outbox_core::{MessageId, Result};

use crate::error::build_error;
use crate::item::{
    self, body_key, get_n, n, now_us, Item, ATTEMPTS, AVAILABLE, BODY_EXP, DEAD_AT, DEAD_ID,
    DONE_AT, DUE, DUE_SCALE, PARTITION_KEY, PARTS, PK, SEQ, TOKEN, TTL,
};
use crate::markers::Transacted;
use crate::settle::BodyTtl;
use crate::store::DynamoOutbox;

impl DynamoOutbox {
    /// Requeue dead letter `id` with its attempts reset, at its original place in its
    /// key's order, its body given a time to live again in the same transaction (see
    /// the module docs). Whether it was a dead letter that went back.
    pub(crate) async fn requeue_one(&self, id: MessageId) -> Result<bool> {
        // The part count, key and sequence never change; the transaction's condition
        // decides whether it is still a dead letter.
        let Some(state) = self.read(id).await? else {
            return Ok(false);
        };
        if !state.contains_key(DEAD_ID) {
            return Ok(false);
        }
        let now = now_us();
        let body_exp = (now + item::duration_us(self.inner.config.body_ttl())).div_ceil(1_000_000);
        let mut actions = vec![self.requeued_state(id, now, body_exp)?];
        actions.extend(self.requeued_marker(id, &state).await?);
        let parts = get_n::<usize>(&state, PARTS).ok().flatten().unwrap_or(1);
        let body_at = actions.len();
        if body_at + parts <= crate::MAX_TRANSACTION_ACTIONS {
            for part in 0..parts {
                actions.push(self.body_ttl_set(id, part, body_exp)?);
            }
        }
        let with_body = actions.len() > body_at;
        let units = &self.inner.metrics.admin_units;
        match self
            .transact("requeue dead letter", actions.clone(), units)
            .await?
        {
            Transacted::Applied if with_body => return Ok(true),
            Transacted::Applied => {}
            Transacted::Refused(failed) if failed.contains(&0) => return Ok(false),
            // Only body parts are missing: the state (and marker) alone, then the
            // parts that exist.
            Transacted::Refused(_) => {
                actions.truncate(body_at);
                if !self
                    .transact_if("requeue dead letter", actions, 0, units)
                    .await?
                {
                    return Ok(false);
                }
            }
        }
        if let Err(e) = self.set_body_ttl(id, parts, BodyTtl::Set(body_exp)).await {
            tracing::warn!(%id, error = %e.report(), "requeued message's body left without a time to live");
        }
        Ok(true)
    }

    /// The state update of a requeue: undelivered again, due now at its original
    /// sequence, attempts reset, `body_exp` recorded; while it is a dead letter.
    fn requeued_state(&self, id: MessageId, now: u64, body_exp: u64) -> Result<TransactWriteItem> {
        let update = format!(
            "SET #{AVAILABLE} = :now, #{DUE} = :base + #{SEQ}, #{ATTEMPTS} = :zero, \
             #{BODY_EXP} = :bexp REMOVE #{DEAD_ID}, #{DEAD_AT}, #{TOKEN}, #{DONE_AT}"
        );
        let condition = format!("attribute_exists(#{DEAD_ID})");
        let update = Update::builder()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .set_expression_attribute_names(Some(item::names(&[&update, &condition])))
            .update_expression(update)
            .condition_expression(condition)
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":base", n(u128::from(now) * DUE_SCALE))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":bexp", n(body_exp))
            .build()
            .map_err(|e| build_error("requeue dead letter", e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Under per-key order, the put of a keyed message's order marker, so no claim
    /// ever sees it undelivered without its place in the key's order.
    async fn requeued_marker(
        &self,
        id: MessageId,
        state: &Item,
    ) -> Result<Option<TransactWriteItem>> {
        if !self.per_key() {
            return Ok(None);
        }
        let (Some(key), Ok(Some(seq))) =
            (item::get_s(state, PARTITION_KEY), get_n::<u64>(state, SEQ))
        else {
            return Ok(None);
        };
        let key_shards = self.table_shards().await?.key_shards;
        let marker = Put::builder()
            .table_name(self.table())
            .set_item(Some(crate::markers::marker_item(key_shards, key, seq, id)))
            .build()
            .map_err(|e| build_error("requeue dead letter", e))?;
        Ok(Some(TransactWriteItem::builder().put(marker).build()))
    }

    /// Discard dead letter `id`: its state item (while it is a dead letter) and every
    /// body item, in one transaction. Whether it was a dead letter that went.
    pub(crate) async fn discard_one(&self, id: MessageId) -> Result<bool> {
        let Some(state) = self.read(id).await? else {
            return Ok(false);
        };
        if !state.contains_key(DEAD_ID) {
            return Ok(false);
        }
        let parts = get_n::<usize>(&state, PARTS).ok().flatten().unwrap_or(1);
        if parts + 1 > crate::MAX_TRANSACTION_ACTIONS {
            // Never enqueued so (an enqueue is one transaction of the state and every
            // part); the state first, then the parts.
            return self
                .delete_if(id, DEAD_ID, "discard dead letter", true)
                .await;
        }
        let condition = format!("attribute_exists(#{DEAD_ID})");
        let message = Delete::builder()
            .table_name(self.table())
            .set_key(Some(self.key_of(id)))
            .set_expression_attribute_names(Some(item::names(&[&condition])))
            .condition_expression(condition)
            .build()
            .map_err(|e| build_error("discard dead letter", e))?;
        let mut actions = vec![TransactWriteItem::builder().delete(message).build()];
        for part in 0..parts {
            let body = Delete::builder()
                .table_name(self.table())
                .set_key(Some(body_key(id, part)))
                .build()
                .map_err(|e| build_error("discard dead letter", e))?;
            actions.push(TransactWriteItem::builder().delete(body).build());
        }
        self.transact_if(
            "discard dead letter",
            actions,
            0,
            &self.inner.metrics.admin_units,
        )
        .await
    }

    /// The requeue's write of body part `part`'s time to live, on a part that exists.
    fn body_ttl_set(&self, id: MessageId, part: usize, at: u64) -> Result<TransactWriteItem> {
        let body = Update::builder()
            .table_name(self.table())
            .set_key(Some(body_key(id, part)))
            .update_expression("SET #ttl = :ttl")
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#ttl", TTL)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":ttl", n(at))
            .build()
            .map_err(|e| build_error("requeue dead letter", e))?;
        Ok(TransactWriteItem::builder().update(body).build())
    }
}
