//! [`DynamoOutbox`]: enqueue into the caller's `TransactWriteItems`, and the settles
//! (complete, fail, release) of [`OutboxStore`]. Claims live in `claim.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    ConsumedCapacity, Put, ReturnConsumedCapacity, ReturnValue, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use futures::stream::{self, StreamExt, TryStreamExt};
use outbox_core::backend::{check_enqueue, in_id_order};
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Failure, store::Lease,
    store::Renewed, store::Settled, store::StoreCapabilities, Error, KeyOrder, MessageId,
    NewMessage, OutboxStore, Result, Retention,
};

use crate::config::DynamoOutboxConfig;
use crate::error::{build_error, cancelled, from_sdk, reason_codes};
use crate::item::{
    self, b, body_key, id_text, item_size, marker_partition, marker_prefix, n, now_us, s, shard_of,
    shard_value, state_key, Item, ATTEMPTS, AVAILABLE, BODY_EXP, CONTENT_TYPE, CREATED,
    DESTINATION, DUE, DUE_SCALE, HEADERS, MARKED_ID, MAX_ITEM_BYTES, MAX_TRANSACTION_ACTIONS,
    MAX_TRANSACTION_BYTES, PARTITION_KEY, PARTS, PAYLOAD, PK, SEQ, SHARD, SK, TTL,
};
use crate::metrics::{Metrics, OutboxMetrics};
use crate::settle::MAX_BATCH_STATEMENTS;

/// Requests in flight at once for the per-item writes of one batch.
pub(crate) const CONCURRENCY: usize = 16;

/// Run `futures` at most [`CONCURRENCY`] at a time, results in input order, stopping
/// at the first error. The futures are made up front: a lazily mapped stream trips the
/// compiler's higher-ranked lifetime inference inside `async_trait` methods.
///
/// Only for reads and for writes whose partial application needs no accounting: the
/// futures still in flight at an error are dropped, after their requests may have
/// landed. Per-message writes go through [`bounded_all`].
pub(crate) async fn bounded<T, F>(futures: Vec<F>) -> Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    stream::iter(futures)
        .buffered(CONCURRENCY)
        .try_collect()
        .await
}

/// Run every one of `futures` to its end, at most [`CONCURRENCY`] at a time, results in
/// input order: one failed write neither stops the others nor drops them in flight.
pub(crate) async fn bounded_all<T, F>(futures: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    stream::iter(futures).buffered(CONCURRENCY).collect().await
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

/// A transactional outbox in a DynamoDB table; see the crate docs for the layout and
/// the claim protocol. Clones share the client and the counters.
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client) -> outbox_core::Result<()> {
/// use outbox_core::NewMessage;
/// use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
///
/// let outbox = DynamoOutbox::new(client, DynamoOutboxConfig::default().with_table("orders_outbox"))?;
/// outbox.install().await?;
/// let paid = NewMessage::builder("orders.paid").payload(b"{\"order\":7}".to_vec()).build()?;
/// // Your own writes (the order item, say) go first; the messages join them in one
/// // TransactWriteItems, so both commit or neither does.
/// let order_write: Vec<aws_sdk_dynamodb::types::TransactWriteItem> = Vec::new();
/// outbox.enqueue(order_write, &[paid]).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoOutbox {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: DynamoOutboxConfig,
    pub(crate) metrics: Metrics,
    /// Until when (microseconds) claims spread over random candidates, after a refused
    /// claim write showed other claimers at work.
    pub(crate) contended_until: AtomicU64,
    /// Index entries this store claimed moments ago: id → (due, when, microseconds).
    pub(crate) recent: std::sync::Mutex<HashMap<MessageId, (u128, u64)>>,
    /// This store's shard leases, when relays divide the shards.
    pub(crate) leases: Option<crate::shards::ShardLeases>,
    /// Where this store's sweeps for bodies to renew stand.
    pub(crate) sweep: crate::sweep::Sweeper,
    /// What the sweep's renewals may write per second (`None`: no limit).
    pub(crate) renewal_budget: Option<crate::renewal_budget::RenewalBudget>,
    /// The table's shard counts as this store last read them.
    pub(crate) known: crate::meta::KnownShards,
}

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
    /// A store over `client` with `config`. Sends nothing. The store keeps its own copy
    /// of the client (same configuration, connections and credentials) with an
    /// interceptor that counts throttled requests (see [`throttled`](Self::throttled));
    /// [`client`](Self::client) returns that copy.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(client: Client, config: DynamoOutboxConfig) -> Result<Self> {
        config.validate()?;
        let metrics = Metrics::default();
        // The same client, with the throttle counter registered on it.
        let counter = crate::throttles::ThrottleCounter(Arc::clone(&metrics.throttles));
        let client = Client::from_conf(client.config().to_builder().interceptor(counter).build());
        Ok(DynamoOutbox {
            inner: Arc::new(Inner {
                client,
                metrics,
                contended_until: AtomicU64::new(0),
                recent: std::sync::Mutex::new(HashMap::new()),
                leases: config.shard_lease().map(crate::shards::ShardLeases::new),
                sweep: crate::sweep::Sweeper::default(),
                renewal_budget: config
                    .renewal_budget()
                    .map(crate::renewal_budget::RenewalBudget::new),
                known: crate::meta::KnownShards::default(),
                config,
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &DynamoOutboxConfig {
        &self.inner.config
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Capacity consumed and conditional writes refused so far by this store and its
    /// clones (every request asks for `ReturnConsumedCapacity = TOTAL`).
    pub fn metrics(&self) -> OutboxMetrics {
        self.inner.metrics.snapshot()
    }

    /// This store's throttled requests so far (clones share them), by operation, index,
    /// code and reason, the ones the SDK retried successfully included; their total is
    /// [`OutboxMetrics::throttled`]. Throttles of the `due` index (`Query` on it, or a
    /// write held back by it, reason `IndexWrite...`) mean too few shards for the rate.
    pub fn throttled(&self) -> Vec<crate::Throttled> {
        self.inner.metrics.throttles.snapshot()
    }

    /// Create the table if it is missing (on-demand billing, the three global secondary
    /// indexes of the crate docs, TTL on `ttl`) and wait until it is active; an
    /// existing table is checked.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists with
    /// another layout (a layout-1 table: see the crate docs' migration note);
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when it is a Global Table
    /// (it lists replicas: claims are conditional writes, atomic only within a region);
    /// mapped SDK errors otherwise.
    pub async fn install(&self) -> Result<()> {
        crate::schema::install(
            &self.inner.client,
            &crate::schema::outbox_table(self.table()),
        )
        .await?;
        crate::schema::refuse_replicas(&self.inner.client, self.table(), "outbox").await?;
        self.check_shards().await.map(|_| ())
    }

    /// Delete the table and everything in it. A missing table is not an error.
    ///
    /// # Errors
    /// Mapped SDK errors.
    pub async fn drop_table(&self) -> Result<()> {
        crate::schema::drop_table(&self.inner.client, self.table()).await
    }

    pub(crate) fn table(&self) -> &str {
        self.inner.config.table()
    }

    pub(crate) fn shards(&self) -> u16 {
        self.inner.config.shards()
    }

    pub(crate) fn per_key(&self) -> bool {
        self.inner.config.capabilities().ordering == KeyOrder::PerKey
    }

    /// What settles ask back: the item (for its order marker) under per-key order,
    /// nothing otherwise.
    pub(crate) fn settle_return(&self) -> ReturnValue {
        if self.per_key() {
            ReturnValue::AllNew
        } else {
            ReturnValue::None
        }
    }

    /// The key of message `id`'s state item.
    pub(crate) fn key_of(&self, id: MessageId) -> Item {
        state_key(id)
    }

    /// The writes that store `messages`, for your own `TransactWriteItems`: per message a
    /// conditional put of its small state item (`attribute_not_exists`, so a stored id
    /// cancels the transaction), a put of each body item (one, or one per
    /// 300 KiB of payload: the split layout), plus one order marker per keyed message
    /// under [`KeyOrder::PerKey`]. Availability and enqueue order are stamped now, by
    /// this process's clock.
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

    pub(crate) fn record_capacity(&self, slot: &AtomicU64, c: Option<&ConsumedCapacity>) {
        Metrics::add(slot, c);
    }

    /// Every item `query` returns, page after page (`what` names it in errors); the
    /// capacity each page reports is added to `units` when given.
    pub(crate) async fn query_all(
        &self,
        query: QueryFluentBuilder,
        what: &str,
        units: Option<&AtomicU64>,
    ) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = query
                .clone()
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| from_sdk(what, e))?;
            if let Some(units) = units {
                self.record_capacity(units, out.consumed_capacity());
            }
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => return Ok(items),
            }
        }
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

#[async_trait]
impl OutboxStore for DynamoOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        self.inner.config.capabilities()
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        self.claim_due(request).await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        self.claim_listed(request).await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
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

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        self.settle_all(failures, |f| f.lease().id, |f| self.fail_one(f))
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle_all(leases, |l| l.id, |l| self.release_one(l))
            .await
    }

    async fn renew(&self, leases: &[Lease], lease: std::time::Duration) -> Result<Renewed> {
        self.renew_leases(leases, lease).await
    }
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
