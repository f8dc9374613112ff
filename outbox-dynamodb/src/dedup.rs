//! [`DynamoDedupStore`]: processed message ids in a DynamoDB table, strongly consistent,
//! for the decoupled consumer algorithm.
//!
//! The layout and protocol are documented on [`DynamoDedupStore`].

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use aws_sdk_dynamodb::Client;
use outbox_core::{Consistency, ConsumerName, Dedup, DedupStore, MessageId, Result};

use crate::config::DynamoDedupConfig;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{self, get_n, id_text, n, now_us, s, Item, PK};

/// The attribute holding when a record expires, in microseconds.
pub(crate) const EXPIRES: &str = "expires_us";
/// The TTL attribute, in epoch seconds.
pub(crate) const TTL: &str = "ttl";

/// Processed message ids per consumer in a DynamoDB table; strongly consistent.
///
/// # Item (layout version 2)
///
/// | `pk` (the only key) | `expires_us` | `ttl` |
/// |---|---|---|
/// | the id, hyphenated lowercase (36 bytes), then the consumer name | when the record expires, microseconds since the epoch | the same, epoch seconds rounded up: the table's TTL attribute |
///
/// Each record is its own partition key: no shards, no item collections, no local
/// index, so no 10 GB cap per shard and no hot shard; DynamoDB spreads records over as
/// many partitions as the traffic needs. `expires_us` decides (sub-second retention
/// works); `ttl` only lets DynamoDB delete.
///
/// # Protocol
///
/// 1. **Record**: one `PutItem` with the condition
///    `attribute_not_exists(pk) OR expires_us <= :now`. DynamoDB applies conditional
///    writes to one item one at a time, so of any number of concurrent records of an id
///    exactly one succeeds ([`Dedup::New`]); the others fail the condition
///    ([`Dedup::Duplicate`]). An expired item that TTL has not deleted yet passes the
///    condition and is overwritten: expired counts as absent.
/// 2. **Check**: one `GetItem` with `ConsistentRead = true`: it returns every write
///    acknowledged before it, which is what makes this store [`Consistency::Strong`].
///    An item whose `expires_us` has passed counts as absent.
/// 3. **Expire**: DynamoDB's TTL deletes expired items in the background, free of
///    write capacity, usually within days; until then they read as absent.
///    [`purge_expired`](DedupStore::purge_expired) is a bounded cleanup by `Scan` (see
///    its docs): correct, but it reads the table, so leave production tables to TTL.
///
/// ## Limitations
///
/// - Expiry follows this process's clock: skew between consumers shifts the retention
///   window by the skew.
/// - **Global Tables**: [`install`](DynamoDedupStore::install) refuses a table whose
///   description lists replicas, since a conditional put is atomic only within its
///   region; a table made global after the install is not detected.
/// - **Migrating from layout 1** (keys `pk` = `d#<shard>` and `sk`, an `expiry` local
///   index): DynamoDB cannot change a table's keys or drop a local index, so `install`
///   on a layout-1 table fails with [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema).
///   Install into a new table name. Records of the old table are not consulted: either
///   copy the unexpired ones first (scan the old table; put each item with
///   `pk` = its old `sk`, keeping `expires_us` and `ttl`), or accept that a message
///   redelivered within one retention period of the switch is processed again, then
///   delete the old table.
///
/// # Example
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::{ConsumerName, Dedup, DedupStore};
/// use outbox_dynamodb::{DynamoDedupConfig, DynamoDedupStore};
///
/// let dedup = DynamoDedupStore::new(client, DynamoDedupConfig::default())?;
/// dedup.install().await?;
/// let billing = ConsumerName::new("billing")?;
/// if dedup.record(&billing, id).await? == Dedup::Duplicate {
///     // already processed
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoDedupStore {
    client: Client,
    config: DynamoDedupConfig,
    retention_us: u64,
}

impl DynamoDedupStore {
    /// A store over `client` with `config`. Sends nothing.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(client: Client, config: DynamoDedupConfig) -> Result<Self> {
        config.validate()?;
        let retention_us = item::duration_us(config.retention()).max(1);
        Ok(DynamoDedupStore {
            client,
            config,
            retention_us,
        })
    }

    /// The settings.
    pub fn config(&self) -> &DynamoDedupConfig {
        &self.config
    }

    /// Create the table if missing (on-demand billing, key `pk`, TTL on `ttl`) and wait
    /// until it is active; an existing table is checked.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists with
    /// another layout (a layout-1 table with a sort key: see the migration note under
    /// the store's `## Limitations`);
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when it is a Global Table
    /// (it lists replicas), since this store declares [`Consistency::Strong`]; mapped
    /// SDK errors otherwise.
    pub async fn install(&self) -> Result<()> {
        crate::schema::install(
            &self.client,
            &crate::schema::dedup_table(self.config.table()),
        )
        .await?;
        crate::schema::refuse_replicas(&self.client, self.config.table(), "dedup store").await
    }

    /// Delete the table. A missing table is not an error.
    ///
    /// # Errors
    /// Mapped SDK errors.
    pub async fn drop_table(&self) -> Result<()> {
        crate::schema::drop_table(&self.client, self.config.table()).await
    }

    /// The primary key of `(consumer, id)`: the id's fixed-width text followed by the
    /// consumer name (unambiguous whatever the name holds).
    pub(crate) fn key(&self, consumer: &ConsumerName, id: MessageId) -> Item {
        Item::from([(
            PK.to_owned(),
            s(format!("{}{}", id_text(id), consumer.as_str())),
        )])
    }
}

#[async_trait]
impl DedupStore for DynamoDedupStore {
    /// [`Consistency::Strong`]: checks are `ConsistentRead` `GetItem`s on the base
    /// table, records are conditional puts.
    fn consistency(&self) -> Consistency {
        Consistency::Strong
    }

    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        let out = self
            .client
            .get_item()
            .table_name(self.config.table())
            .set_key(Some(self.key(consumer, id)))
            .consistent_read(true)
            .projection_expression("#e")
            .expression_attribute_names("#e", EXPIRES)
            .send()
            .await
            .map_err(|e| from_sdk("look up message id", e))?;
        let Some(item) = out.item else {
            return Ok(false);
        };
        let expires: Option<u64> = get_n(&item, EXPIRES)?;
        Ok(expires.is_some_and(|e| e > now_us()))
    }

    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        let now = now_us();
        let expires = now.saturating_add(self.retention_us);
        let mut item = self.key(consumer, id);
        item.insert(EXPIRES.into(), n(expires));
        item.insert(TTL.into(), n(expires.div_ceil(1_000_000)));
        let sent = self
            .client
            .put_item()
            .table_name(self.config.table())
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#pk) OR #e <= :now")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_values(":now", n(now))
            .return_consumed_capacity(ReturnConsumedCapacity::None)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Dedup::New),
            Err(e) if is_condition_failed(&e) => Ok(Dedup::Duplicate),
            Err(e) => Err(from_sdk("record message id", e)),
        }
    }

    /// A bounded cleanup: `Scan` pages (strongly consistent, filtered on
    /// `expires_us <= now`) until `limit` expired records are found or the table ends,
    /// and delete each with the condition that it is still expired (a record written
    /// again meanwhile is spared). Returns how many were deleted.
    ///
    /// Kept rather than made a no-op so that [`Purger::for_dedup`](outbox_core::Purger::for_dedup)
    /// and tests keep their meaning, but a scan reads the whole table (every item read
    /// is billed) on each call that does not fill its limit early: on large tables rely
    /// on TTL, which deletes for free, and run no dedup purger.
    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let now = now_us();
        let mut deleted: u64 = 0;
        let mut start: Option<Item> = None;
        loop {
            let remaining = limit - usize::try_from(deleted).unwrap_or(limit);
            if remaining == 0 {
                break;
            }
            let out = self
                .client
                .scan()
                .table_name(self.config.table())
                .consistent_read(true)
                .filter_expression("#e <= :now")
                .projection_expression("#pk")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#e", EXPIRES)
                .expression_attribute_values(":now", n(now))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| from_sdk("purge message ids", e))?;
            let keys: Vec<Item> = out
                .items()
                .iter()
                .take(remaining)
                .map(|i| {
                    i.iter()
                        .filter(|(k, _)| *k == PK)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .collect();
            let done: Vec<bool> = crate::concurrency::bounded(
                keys.into_iter()
                    .map(|key| async move {
                        let sent = self
                            .client
                            .delete_item()
                            .table_name(self.config.table())
                            .set_key(Some(key))
                            .condition_expression("#e <= :now")
                            .expression_attribute_names("#e", EXPIRES)
                            .expression_attribute_values(":now", n(now))
                            .send()
                            .await;
                        match sent {
                            Ok(_) => Ok(true),
                            // Recorded again since the scan: fresh, so spared.
                            Err(e) if is_condition_failed(&e) => Ok(false),
                            Err(e) => Err(from_sdk("purge message ids", e)),
                        }
                    })
                    .collect(),
            )
            .await?;
            deleted += done.into_iter().filter(|d| *d).count() as u64;
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => break,
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_do_not_collide_across_consumers() {
        let id = MessageId::new();
        let a = ConsumerName::new("a").unwrap();
        let ab = ConsumerName::new("ab").unwrap();
        let pk = |k: &Item| k[PK].as_s().unwrap().clone();
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        );
        let store = DynamoDedupStore::new(client, DynamoDedupConfig::default()).unwrap();
        assert_ne!(pk(&store.key(&a, id)), pk(&store.key(&ab, id)));
        assert_eq!(pk(&store.key(&ab, id)), format!("{}ab", id_text(id)));
        assert_eq!(store.key(&a, id).len(), 1, "one key attribute, no sort key");
    }
}
