//! [`DynamoOutbox`]: the store's handle (client, config, counters and the state its
//! clones share), its constructor, accessors and table install, and `impl OutboxStore`,
//! which hands each method to the module doing it: claims in `claim.rs`, completes in
//! `complete.rs`, fails and releases in `settle.rs`, renewals in `renew.rs`. Enqueue
//! lives in `enqueue.rs`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnValue};
use aws_sdk_dynamodb::Client;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Failure, store::Lease,
    store::Renewed, store::Settled, store::StoreCapabilities, KeyOrder, MessageId, OutboxStore,
    Result,
};

use crate::config::DynamoOutboxConfig;
use crate::error::from_sdk;
use crate::item::{state_key, Item};
use crate::metrics::{Metrics, OutboxMetrics};

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
        self.complete_leases(leases).await
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
