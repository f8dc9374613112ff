//! [`StreamOutbox`]: the message table, enqueue into the caller's
//! `TransactWriteItems`, and the dead letters the relay writes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use aws_sdk_dynamodb::types::{
    Put, ReturnConsumedCapacity, ScalarAttributeType, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use outbox_core::backend::check_enqueue;
use outbox_core::{Error, ErrorKind, MessageId, NewMessage, Result};
use outbox_dynamodb::kit::{
    build_error, drop_table, from_sdk, install_table, is_condition_failed, send_enqueue, Item,
    TableSpec,
};

use crate::capacity::{Capacity, StreamOutboxMetrics};
use crate::config::StreamOutboxConfig;
use crate::item::{
    self, dead_sk, get_n, get_s, message_pk, n, now_us, s, ATTEMPTS, DEAD_ID, DEAD_PK, DEAD_SEQ,
    DEAD_SHARD, DESTINATION, FIRST_PART, PK, REASON, SK, TTL,
};
use crate::leases::LEASE_TTL;

/// A message the relay gave up on: permanently refused by the broker, out of
/// attempts, or a message item that does not decode. The message item itself stays in
/// the table until its time to live: read it by id to inspect or resend it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamDeadLetter {
    /// The message's id.
    pub id: MessageId,
    /// Its destination (empty when it did not decode).
    pub destination: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Publish attempts made.
    pub attempts: u32,
    /// When it was dead-lettered.
    pub dead_at: SystemTime,
    /// The stream shard its record was read from.
    pub shard: String,
    /// The record's sequence number in that shard.
    pub sequence_number: String,
}

/// A transactional outbox whose messages are immutable items of a DynamoDB table with
/// a stream; a [`StreamRelay`](crate::StreamRelay) publishes them from the stream.
/// Clones share the client.
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client) -> outbox_core::Result<()> {
/// use outbox_core::NewMessage;
/// use outbox_dynamodb_streams::{StreamOutbox, StreamOutboxConfig};
///
/// let outbox = StreamOutbox::new(client, StreamOutboxConfig::default().with_table("orders_outbox"))?;
/// outbox.install().await?;
/// let paid = NewMessage::builder("orders.paid").payload(b"{\"order\":7}".to_vec()).build()?;
/// // Your own writes go first; the message joins them in one TransactWriteItems.
/// let order_write: Vec<aws_sdk_dynamodb::types::TransactWriteItem> = Vec::new();
/// outbox.enqueue(order_write, &[paid]).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StreamOutbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    config: StreamOutboxConfig,
    capacity: Arc<Capacity>,
}

impl StreamOutbox {
    /// An outbox over `client` with `config`. Sends nothing.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when `config` does not validate.
    pub fn new(client: Client, config: StreamOutboxConfig) -> Result<Self> {
        config.validate()?;
        Ok(StreamOutbox {
            inner: Arc::new(Inner {
                client,
                config,
                capacity: Arc::default(),
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &StreamOutboxConfig {
        &self.inner.config
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Capacity consumed so far by this outbox, its clones and the relays over it.
    pub fn metrics(&self) -> StreamOutboxMetrics {
        self.inner.capacity.snapshot()
    }

    pub(crate) fn capacity(&self) -> &Arc<Capacity> {
        &self.inner.capacity
    }

    pub(crate) fn table(&self) -> &str {
        self.inner.config.table()
    }

    /// Create the message table (keys `pk`/`sk`, on-demand billing, a stream of new
    /// images, time to live on `ttl`) and the lease table (key `pk`, time to live on
    /// `ttl`) when missing, and wait until both are active; existing tables are
    /// checked.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`] when a table exists with another layout (another key, no
    /// stream, a stream without new images, time to live on another attribute); mapped
    /// SDK errors otherwise.
    pub async fn install(&self) -> Result<()> {
        install_table(&self.inner.client, &message_table(self.table())).await?;
        install_table(
            &self.inner.client,
            &lease_table(&self.inner.config.lease_table()),
        )
        .await
    }

    /// Delete both tables and everything in them (the stream goes with the message
    /// table). Missing tables are not an error.
    ///
    /// # Errors
    /// Mapped SDK errors.
    pub async fn drop_tables(&self) -> Result<()> {
        drop_table(&self.inner.client, self.table()).await?;
        drop_table(&self.inner.client, &self.inner.config.lease_table()).await
    }

    /// The ARN of the message table's current stream.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`] when the table is missing or has no stream; mapped SDK
    /// errors.
    pub async fn stream_arn(&self) -> Result<String> {
        let out = self
            .inner
            .client
            .describe_table()
            .table_name(self.table())
            .send()
            .await
            .map_err(|e| from_sdk("describe the message table", e))?;
        out.table()
            .filter(|t| t.stream_specification().is_some_and(|s| s.stream_enabled()))
            .and_then(|t| t.latest_stream_arn())
            .map(str::to_owned)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Schema,
                    format!(
                        "table {} has no stream: run StreamOutbox::install",
                        self.table()
                    ),
                )
            })
    }

    /// The writes that store `messages`, for your own `TransactWriteItems`: per message
    /// a conditional put of its first item (`attribute_not_exists`, so a stored id
    /// cancels the transaction) and a put per further 300 KiB of payload.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a message breaking the config's limits, one with
    /// a delay (a stream cannot hold a message back: use `outbox-dynamodb`'s
    /// `DynamoOutbox` for delayed messages) or an item over
    /// [`MAX_ITEM_BYTES`](outbox_dynamodb::MAX_ITEM_BYTES);
    /// [`ErrorKind::Conflict`] for an id given twice.
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
        if let Some(m) = messages.iter().find(|m| !m.delay().is_zero()) {
            return Err(Error::invalid_input(format!(
                "message {} has a delay of {:?}: a stream publishes a message as soon as it \
                 commits and cannot hold it back; enqueue delayed messages into \
                 outbox-dynamodb's DynamoOutbox (the polling store) instead",
                m.id(),
                m.delay()
            ))
            .with_ids(vec![m.id()]));
        }
        let now = now_us();
        let mut writes = Vec::new();
        for m in messages {
            for (i, item) in item::message_items(m, now, self.inner.config.item_ttl())?
                .into_iter()
                .enumerate()
            {
                let mut put = Put::builder().table_name(self.table()).set_item(Some(item));
                if i == 0 {
                    put = put
                        .condition_expression("attribute_not_exists(#pk)")
                        .expression_attribute_names("#pk", PK);
                }
                let put = put.build().map_err(|e| build_error("enqueue", e))?;
                writes.push((
                    TransactWriteItem::builder().put(put).build(),
                    (i == 0).then_some(m.id()),
                ));
            }
        }
        Ok(writes)
    }

    /// Send one `TransactWriteItems` holding `writes` (yours, first, in order) and the
    /// writes of `messages`: your changes and the messages commit together or not at
    /// all. Limits are checked before anything is sent; nothing is sent when both are
    /// empty. A single message of one item with no writes of yours is sent as a
    /// conditional `PutItem`: atomic on its own, at half a transaction's write units.
    ///
    /// # Errors
    /// As [`enqueue_writes`](Self::enqueue_writes), plus [`ErrorKind::InvalidInput`] for
    /// a transaction over DynamoDB's limits; [`ErrorKind::Conflict`] naming ids already
    /// stored (see [`Error::ids`]) or when one of your own conditions failed; mapped SDK
    /// errors. After an ambiguous error (a timeout), a retry refused with every id of
    /// your messages in [`Error::ids`] means the first attempt committed.
    pub async fn enqueue(
        &self,
        writes: Vec<TransactWriteItem>,
        messages: &[NewMessage],
    ) -> Result<()> {
        let ours = self.build_writes(messages)?;
        if writes.is_empty() && ours.len() == 1 {
            // One item alone is atomic as a plain conditional put, at half a
            // transaction's write units.
            let (only, id) = &ours[0];
            return self.put_alone(only, *id).await;
        }
        let consumed = send_enqueue(&self.inner.client, writes, ours).await?;
        for c in &consumed {
            self.inner.capacity.enqueue.add(Some(c));
        }
        self.inner
            .capacity
            .enqueued
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Store a message of one item with a conditional `PutItem`.
    async fn put_alone(&self, write: &TransactWriteItem, id: Option<MessageId>) -> Result<()> {
        let Some(put) = write.put() else {
            return Err(Error::new(ErrorKind::Storage, "enqueue: not a put"));
        };
        let sent = self
            .inner
            .client
            .put_item()
            .table_name(put.table_name())
            .set_item(Some(put.item().clone()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.inner.capacity.enqueue.add(out.consumed_capacity());
                self.inner.capacity.enqueued.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if is_condition_failed(&e) => {
                Err(Error::already_stored(id.into_iter().collect()).with_source(e))
            }
            Err(e) => Err(from_sdk("enqueue", e)),
        }
    }

    /// Parts 1.. of message `id` (part 0 came with its stream record), read strongly
    /// consistent, in part order.
    pub(crate) async fn read_parts(&self, id: MessageId) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .inner
                .client
                .query()
                .table_name(self.table())
                .consistent_read(true)
                .key_condition_expression("#pk = :pk AND #sk > :first")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#sk", SK)
                .expression_attribute_values(":pk", s(message_pk(id)))
                .expression_attribute_values(":first", s(FIRST_PART))
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| from_sdk("read message parts", e))?;
            self.inner.capacity.part_reads.add(out.consumed_capacity());
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => return Ok(items),
            }
        }
    }

    /// Write a dead letter (idempotent: the same message dead-lettered twice, by two
    /// relays during a takeover, writes two entries naming one id).
    pub(crate) async fn write_dead_letter(&self, dead: &StreamDeadLetter) -> Result<()> {
        let dead_us = item::micros(dead.dead_at);
        let item: Item = HashMap::from([
            (PK.to_owned(), s(DEAD_PK)),
            (SK.to_owned(), s(dead_sk(dead_us, dead.id))),
            (DEAD_ID.to_owned(), s(item::id_text(dead.id))),
            (DESTINATION.to_owned(), s(&dead.destination)),
            (REASON.to_owned(), s(&dead.reason)),
            (ATTEMPTS.to_owned(), n(dead.attempts)),
            (DEAD_SHARD.to_owned(), s(&dead.shard)),
            (DEAD_SEQ.to_owned(), s(&dead.sequence_number)),
        ]);
        let out = self
            .inner
            .client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| from_sdk("write a dead letter", e))?;
        self.inner
            .capacity
            .dead_letters
            .add(out.consumed_capacity());
        Ok(())
    }

    /// The dead letters, oldest first, at most `limit`.
    ///
    /// # Errors
    /// Mapped SDK errors; [`ErrorKind::Decode`] for an entry that does not decode.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<StreamDeadLetter>> {
        let mut out = Vec::new();
        let mut start = None;
        while out.len() < limit {
            let page = self
                .inner
                .client
                .query()
                .table_name(self.table())
                .consistent_read(true)
                .key_condition_expression("#pk = :dead")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":dead", s(DEAD_PK))
                .limit(i32::try_from(limit - out.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| from_sdk("read dead letters", e))?;
            for entry in page.items() {
                out.push(decode_dead_letter(entry)?);
            }
            match page.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => break,
            }
        }
        Ok(out)
    }
}

fn decode_dead_letter(entry: &Item) -> Result<StreamDeadLetter> {
    let bad = |what: &str| Error::new(ErrorKind::Decode, format!("dead letter {what}"));
    let sk = get_s(entry, SK).ok_or_else(|| bad("has no sort key"))?;
    let dead_us = sk
        .split('#')
        .next()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| bad("has a malformed sort key"))?;
    let id = get_s(entry, DEAD_ID)
        .and_then(|t| uuid::Uuid::parse_str(t).ok())
        .map(MessageId::from_uuid)
        .ok_or_else(|| bad("has no id"))?;
    Ok(StreamDeadLetter {
        id,
        destination: get_s(entry, DESTINATION).unwrap_or_default().to_owned(),
        reason: get_s(entry, REASON).unwrap_or_default().to_owned(),
        attempts: get_n(entry, ATTEMPTS).unwrap_or(0),
        dead_at: item::from_micros(dead_us),
        shard: get_s(entry, DEAD_SHARD).unwrap_or_default().to_owned(),
        sequence_number: get_s(entry, DEAD_SEQ).unwrap_or_default().to_owned(),
    })
}

/// The message table: `pk`/`sk` strings, a stream of new images, TTL on `ttl`.
pub(crate) fn message_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash: PK,
        range: Some(SK),
        attributes: vec![(PK, ScalarAttributeType::S), (SK, ScalarAttributeType::S)],
        indexes: vec![],
        ttl: Some(TTL),
        stream: true,
    }
}

/// The lease table: one `pk` string per shard lease and worker heartbeat, TTL on the
/// heartbeats.
pub(crate) fn lease_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash: PK,
        range: None,
        attributes: vec![(PK, ScalarAttributeType::S)],
        indexes: vec![],
        ttl: Some(LEASE_TTL),
        stream: false,
    }
}
