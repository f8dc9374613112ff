//! [`DynamoDedupStore`]: processed message ids in a DynamoDB table, strongly consistent,
//! for the decoupled consumer algorithm.
//!
//! # Protocol
//!
//! 1. **Record**: one `PutItem` of `(consumer, id)` with the condition
//!    `attribute_not_exists(sk) OR expires_us <= :now`. DynamoDB applies conditional
//!    writes to one item one at a time, so of any number of concurrent records of an id
//!    exactly one succeeds ([`Dedup::New`]); the others fail the condition
//!    ([`Dedup::Duplicate`]). An expired item that TTL has not deleted yet passes the
//!    condition and is overwritten: expired counts as absent.
//! 2. **Check**: one `GetItem` with `ConsistentRead = true` on the base table (never an
//!    index): it returns every write acknowledged before it, which is what makes this
//!    store [`Consistency::Strong`]. An item whose `expires_us` has passed counts as
//!    absent.
//! 3. **Expire**: the `ttl` attribute (epoch seconds) lets DynamoDB's TTL delete expired
//!    items in the background, free of write capacity, usually within days.
//!    [`purge_expired`](DedupStore::purge_expired) deletes them sooner, found through the
//!    `expiry` local secondary index of each shard (strongly consistent queries, no
//!    scan), each delete conditional on the item still being expired.
//!
//! ## Limitations
//!
//! - Expiry follows this process's clock: skew between consumers shifts the retention
//!   window by the skew.
//! - Items are spread over a fixed number of shard partitions (for the purge index);
//!   each shard's item collection is limited to 10 GB by DynamoDB (about 80 million
//!   records per shard).

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use aws_sdk_dynamodb::Client;
use outbox_core::{Consistency, ConsumerName, Dedup, DedupStore, MessageId, Result};

use crate::config::DynamoDedupConfig;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{self, get_n, id_text, n, now_us, s, shard_of, Item, PK, SK};

/// The attribute holding when a record expires, in microseconds (the sort key of the
/// expiry index).
pub(crate) const EXPIRES: &str = "expires_us";
/// The TTL attribute, in epoch seconds.
pub(crate) const TTL: &str = "ttl";
/// The local secondary index of records by expiry.
pub(crate) const EXPIRY_INDEX: &str = "expiry";

/// Processed message ids per consumer in a DynamoDB table; strongly consistent.
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

    /// Create the table if missing (on-demand billing, the expiry index, TTL on `ttl`)
    /// and wait until it is active; an existing table is checked.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists with
    /// another layout; mapped SDK errors otherwise.
    pub async fn install(&self) -> Result<()> {
        crate::schema::install(
            &self.client,
            &crate::schema::dedup_table(self.config.table()),
        )
        .await
    }

    /// Delete the table. A missing table is not an error.
    ///
    /// # Errors
    /// Mapped SDK errors.
    pub async fn drop_table(&self) -> Result<()> {
        crate::schema::drop_table(&self.client, self.config.table()).await
    }

    /// The primary key of `(consumer, id)`: the shard of both, and the id's fixed-width
    /// text followed by the consumer name (unambiguous whatever the name holds).
    pub(crate) fn key(&self, consumer: &ConsumerName, id: MessageId) -> Item {
        let id = id_text(id);
        let shard = shard_of(
            &[consumer.as_str().as_bytes(), id.as_bytes()],
            self.config.shards(),
        );
        Item::from([
            (PK.to_owned(), s(partition(shard))),
            (SK.to_owned(), s(format!("{id}{}", consumer.as_str()))),
        ])
    }
}

fn partition(shard: u16) -> String {
    format!("d#{shard:03}")
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
            .condition_expression("attribute_not_exists(#sk) OR #e <= :now")
            .expression_attribute_names("#sk", SK)
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

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let now = now_us();
        let mut deleted: u64 = 0;
        // Shards one after another: the limit is global, and a purge is housekeeping.
        for shard in 0..self.config.shards() {
            let remaining = limit - usize::try_from(deleted).unwrap_or(limit);
            if remaining == 0 {
                break;
            }
            let out = self
                .client
                .query()
                .table_name(self.config.table())
                .index_name(EXPIRY_INDEX)
                .consistent_read(true)
                .key_condition_expression("#pk = :pk AND #e <= :now")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_names("#e", EXPIRES)
                .expression_attribute_values(":pk", s(partition(shard)))
                .expression_attribute_values(":now", n(now))
                .limit(i32::try_from(remaining.min(1000)).unwrap_or(1000))
                .send()
                .await
                .map_err(|e| from_sdk("purge message ids", e))?;
            let keys: Vec<Item> = out
                .items()
                .iter()
                .map(|i| {
                    i.iter()
                        .filter(|(k, _)| *k == PK || *k == SK)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .collect();
            let done: Vec<bool> = crate::store::bounded(
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
                            // Recorded again since the query: fresh, so spared.
                            Err(e) if is_condition_failed(&e) => Ok(false),
                            Err(e) => Err(from_sdk("purge message ids", e)),
                        }
                    })
                    .collect(),
            )
            .await?;
            deleted += done.into_iter().filter(|d| *d).count() as u64;
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
        let sk = |k: &Item| k[SK].as_s().unwrap().clone();
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        );
        let store = DynamoDedupStore::new(client, DynamoDedupConfig::default()).unwrap();
        assert_ne!(sk(&store.key(&a, id)), sk(&store.key(&ab, id)));
        assert!(sk(&store.key(&a, id)).starts_with(&id_text(id)));
    }
}
