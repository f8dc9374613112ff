//! Enqueue: the writes that store messages (a conditional put of each message's state
//! item, its body items and, under per-key order, its order marker), checked against
//! DynamoDB's transaction limits, and the one `TransactWriteItems` that sends them
//! after the caller's own writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConsumedCapacity, Put, ReturnConsumedCapacity, TransactWriteItem};
use aws_sdk_dynamodb::Client;
use outbox_core::backend::check_enqueue;
use outbox_core::{Error, MessageId, NewMessage, Result};

use crate::error::{build_error, cancelled, from_sdk, reason_codes};
use crate::item::{
    self, b, body_key, item_size, n, now_us, s, shard_value, ATTEMPTS, AVAILABLE, BODY_EXP,
    CONTENT_TYPE, CREATED, DESTINATION, DUE, DUE_SCALE, HEADERS, MAX_ITEM_BYTES,
    MAX_TRANSACTION_ACTIONS, MAX_TRANSACTION_BYTES, PARTITION_KEY, PARTS, PAYLOAD, PK, SEQ, SHARD,
    TTL,
};
use crate::markers::marker_item;
use crate::store::DynamoOutbox;

/// The enqueue sequence: microseconds of this process's clock, strictly increasing
/// within the process, so a batch and successive enqueues keep their order.
fn next_seq() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now_us().max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => prev = seen,
        }
    }
}

/// Check a transaction against DynamoDB's limits before sending it: at most
/// [`MAX_TRANSACTION_ACTIONS`] actions, at most [`MAX_TRANSACTION_BYTES`] of items, and
/// no put item over [`MAX_ITEM_BYTES`]. Sizes are those of what the request carries
/// (whole items for puts, keys and values for the other actions).
///
/// # Errors
/// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) naming the limit.
pub fn check_transaction(writes: &[TransactWriteItem]) -> Result<()> {
    if writes.len() > MAX_TRANSACTION_ACTIONS {
        return Err(Error::invalid_input(format!(
            "a transaction of {} actions exceeds DynamoDB's limit of {MAX_TRANSACTION_ACTIONS}; \
             enqueue fewer messages per transaction (a message takes one action for its \
             state, one per 300 KiB of payload, and one more for its order marker when keyed \
             under per-key order)",
            writes.len()
        )));
    }
    let mut total = 0;
    for (i, w) in writes.iter().enumerate() {
        let size = write_size(w);
        if w.put().is_some() && size > MAX_ITEM_BYTES {
            return Err(Error::invalid_input(format!(
                "action {i} puts an item of {size} bytes, over DynamoDB's item limit of \
                 {MAX_ITEM_BYTES}"
            )));
        }
        total += size;
    }
    if total > MAX_TRANSACTION_BYTES {
        return Err(Error::invalid_input(format!(
            "a transaction of {total} bytes exceeds DynamoDB's limit of {MAX_TRANSACTION_BYTES}"
        )));
    }
    Ok(())
}

fn write_size(w: &TransactWriteItem) -> usize {
    if let Some(p) = w.put() {
        return item_size(p.item());
    }
    let values = |v: Option<&HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>| {
        v.map_or(0, item_size)
    };
    if let Some(u) = w.update() {
        return item_size(u.key()) + values(u.expression_attribute_values());
    }
    if let Some(d) = w.delete() {
        return item_size(d.key()) + values(d.expression_attribute_values());
    }
    if let Some(c) = w.condition_check() {
        return item_size(c.key()) + values(c.expression_attribute_values());
    }
    0
}

impl DynamoOutbox {
    /// The writes that store `messages`, for your own `TransactWriteItems`: per message a
    /// conditional put of its small state item (`attribute_not_exists`, so a stored id
    /// cancels the transaction), a put of each body item (one, or one per
    /// 300 KiB of payload: the split layout), plus one order marker per keyed message
    /// under [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey). Availability and
    /// enqueue order are stamped now, by this process's clock.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    /// breaking the config's limits or making an item over [`MAX_ITEM_BYTES`];
    /// [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for an id given twice.
    pub fn enqueue_writes(&self, messages: &[NewMessage]) -> Result<Vec<TransactWriteItem>> {
        Ok(self
            .build_writes(messages)?
            .into_iter()
            .map(|(w, _)| w)
            .collect())
    }

    fn build_writes(
        &self,
        messages: &[NewMessage],
    ) -> Result<Vec<(TransactWriteItem, Option<MessageId>)>> {
        check_enqueue(messages, self.inner.config.limits())?;
        let table = self.checked_shards()?;
        let now = now_us();
        let mut writes = Vec::with_capacity(messages.len());
        let body_ttl = item::duration_us(self.inner.config.body_ttl());
        for m in messages {
            let seq = next_seq();
            let avail = now.saturating_add(item::duration_us(m.delay()));
            let headers = m.headers().to_json().to_string();
            let first_extra = headers.len() + m.content_type().map_or(0, str::len);
            let chunks = item::body_parts(m.payload(), first_extra);
            let mut state = self.key_of(m.id());
            state.insert(SHARD.into(), s(shard_value(m.id(), table.shards)));
            state.insert(DESTINATION.into(), s(m.destination()));
            state.insert(CREATED.into(), n(now));
            state.insert(AVAILABLE.into(), n(avail));
            state.insert(SEQ.into(), n(seq));
            state.insert(ATTEMPTS.into(), n(0));
            state.insert(PARTS.into(), n(chunks.len()));
            state.insert(
                DUE.into(),
                n(u128::from(avail) * DUE_SCALE + u128::from(seq)),
            );
            if let Some(key) = m.partition_key() {
                state.insert(PARTITION_KEY.into(), s(key));
            }
            let expires = avail.saturating_add(body_ttl).div_ceil(1_000_000);
            state.insert(BODY_EXP.into(), n(expires));
            let mut items = vec![state];
            for (i, chunk) in chunks.iter().enumerate() {
                let mut part = body_key(m.id(), i);
                part.insert(PAYLOAD.into(), b(chunk));
                part.insert(TTL.into(), n(expires));
                if i == 0 {
                    part.insert(HEADERS.into(), s(&headers));
                    if let Some(ct) = m.content_type() {
                        part.insert(CONTENT_TYPE.into(), s(ct));
                    }
                }
                items.push(part);
            }
            for item in &items {
                let size = item_size(item);
                if size > MAX_ITEM_BYTES {
                    return Err(Error::invalid_input(format!(
                        "message {} makes an item of {size} bytes, over DynamoDB's item limit \
                         of {MAX_ITEM_BYTES}; keep headers small and store large bodies \
                         elsewhere (S3) with a reference in the message",
                        m.id()
                    )));
                }
            }
            for (i, item) in items.into_iter().enumerate() {
                let mut put = Put::builder().table_name(self.table()).set_item(Some(item));
                if i == 0 {
                    put = put
                        .condition_expression("attribute_not_exists(#pk)")
                        .expression_attribute_names("#pk", PK);
                }
                let put = put.build().map_err(|e| build_error("enqueue", e))?;
                let id = (i == 0).then_some(m.id());
                writes.push((TransactWriteItem::builder().put(put).build(), id));
            }
            if let (true, Some(key)) = (self.per_key(), m.partition_key()) {
                let marker = marker_item(table.key_shards, key, seq, m.id());
                let put = Put::builder()
                    .table_name(self.table())
                    .set_item(Some(marker))
                    .build()
                    .map_err(|e| build_error("enqueue", e))?;
                writes.push((TransactWriteItem::builder().put(put).build(), None));
            }
        }
        Ok(writes)
    }

    /// Send one `TransactWriteItems` holding `writes` (yours, first, in order) and the
    /// writes of `messages`: your changes and the messages commit together or not at
    /// all. The limits are checked before anything is sent. Nothing is sent when both
    /// are empty.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a bad
    /// message or a transaction over [`MAX_TRANSACTION_ACTIONS`] actions,
    /// [`MAX_TRANSACTION_BYTES`] or an item over [`MAX_ITEM_BYTES`];
    /// [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming ids already
    /// stored (see [`Error::ids`]) or when one of your own conditions failed; mapped
    /// SDK errors otherwise. An error DynamoDB answered (a refusal, a cancelled
    /// transaction, a throttle past the SDK's retries) wrote nothing. An ambiguous one
    /// (a timeout, a connection lost after sending) may have committed: the SDK's own
    /// retries reuse the request's idempotency token, but a retry of this call sends a
    /// new transaction, and when the first did commit it fails with
    /// [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming every message
    /// id. So after an ambiguous error, a retry refused with every id of your messages
    /// in [`Error::ids`] means the first attempt committed, and with it your writes (a
    /// transaction commits whole). The ids are named only when none of your own writes'
    /// conditions failed too: with a condition that the first attempt's commit makes
    /// fail (a put of a new order, say), the retry's error names no ids, and your own
    /// write's effect tells whether the first attempt committed.
    pub async fn enqueue(
        &self,
        writes: Vec<TransactWriteItem>,
        messages: &[NewMessage],
    ) -> Result<()> {
        if !messages.is_empty() {
            self.table_shards().await?;
        }
        let ours = self.build_writes(messages)?;
        let consumed = send_enqueue(&self.inner.client, writes, ours).await?;
        self.inner.metrics.enqueue(&consumed, messages.len());
        Ok(())
    }
}

/// Send `writes` (the caller's, first, in order) and `ours` (each with the id of the
/// message whose first item it puts, if it does) in one `TransactWriteItems`, after
/// checking DynamoDB's limits; nothing is sent when both are empty. The capacity it
/// consumed, per table.
///
/// # Errors
/// As [`DynamoOutbox::enqueue`]: the limits, stored ids ([`enqueue_error`]), mapped SDK
/// errors.
pub async fn send_enqueue(
    client: &Client,
    writes: Vec<TransactWriteItem>,
    ours: Vec<(TransactWriteItem, Option<MessageId>)>,
) -> Result<Vec<ConsumedCapacity>> {
    let theirs = writes.len();
    let ids: Vec<Option<MessageId>> = std::iter::repeat_n(None, theirs)
        .chain(ours.iter().map(|(_, id)| *id))
        .collect();
    let all: Vec<TransactWriteItem> = writes
        .into_iter()
        .chain(ours.into_iter().map(|(w, _)| w))
        .collect();
    if all.is_empty() {
        return Ok(Vec::new());
    }
    check_transaction(&all)?;
    client
        .transact_write_items()
        .set_transact_items(Some(all))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map(|out| out.consumed_capacity.unwrap_or_default())
        .map_err(|e| enqueue_error(e, &ids, theirs))
}

/// The error of a `TransactWriteItems` that stored messages after `theirs` writes of
/// the caller's: a cancellation whose only failed conditions are those of message puts
/// (`ids`, one entry per action, `Some` on the put that stores a message) is
/// [`Error::already_stored`] naming them; anything else is mapped as usual.
pub fn enqueue_error(
    e: aws_sdk_dynamodb::error::SdkError<
        TransactWriteItemsError,
        aws_sdk_dynamodb::config::http::HttpResponse,
    >,
    ids: &[Option<MessageId>],
    theirs: usize,
) -> Error {
    let reasons: Vec<Option<String>> = match e.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
            reason_codes(c.cancellation_reasons())
                .into_iter()
                .map(|r| r.map(str::to_owned))
                .collect()
        }
        _ => return from_sdk("enqueue", e),
    };
    let failed_condition =
        |i: &usize| reasons.get(*i).and_then(Option::as_deref) == Some("ConditionalCheckFailed");
    let stored: Vec<MessageId> = (theirs..ids.len())
        .filter(failed_condition)
        .filter_map(|i| ids[i])
        .collect();
    let borrowed: Vec<Option<&str>> = reasons.iter().map(Option::as_deref).collect();
    if !stored.is_empty() && (0..theirs).all(|i| !failed_condition(&i)) {
        return Error::already_stored(stored).with_source(e);
    }
    cancelled("enqueue", &borrowed, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;

    fn put_of(bytes: usize) -> TransactWriteItem {
        let item = HashMap::from([("p".to_owned(), AttributeValue::B(vec![0u8; bytes].into()))]);
        TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name("t")
                    .set_item(Some(item))
                    .build()
                    .unwrap(),
            )
            .build()
    }

    #[test]
    fn transaction_limits_are_checked_before_sending() {
        check_transaction(&vec![put_of(10); MAX_TRANSACTION_ACTIONS]).unwrap();
        let err = check_transaction(&vec![put_of(10); MAX_TRANSACTION_ACTIONS + 1]).unwrap_err();
        assert_eq!(err.kind(), outbox_core::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("100"), "{err}");
        let err = check_transaction(&[put_of(MAX_ITEM_BYTES)]).unwrap_err();
        assert!(err.to_string().contains("item limit"), "{err}");
        let err = check_transaction(&vec![put_of(300 * 1024); 14]).unwrap_err();
        assert!(err.to_string().contains("4194304"), "{err}");
    }

    #[test]
    fn sequences_increase_strictly() {
        let seqs: Vec<u64> = (0..1000).map(|_| next_seq()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    }
}
