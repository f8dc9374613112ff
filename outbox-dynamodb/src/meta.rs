//! The table's shard counts, kept in the table itself so that every store agrees on
//! them: one item, `pk = c`, `sk = shards`, outside every index.
//!
//! | attribute | meaning |
//! |---|---|
//! | `shards` | how many `due` shards relays claim from; writers spread messages over this many or fewer; it only grows |
//! | `key_shards` | how many partitions the order markers are spread over; fixed when the item is first written |
//!
//! The first store to check the table (its [`install`](DynamoOutbox::install), first
//! claim, first [`enqueue`](DynamoOutbox::enqueue) or an explicit
//! [`check_shards`](DynamoOutbox::check_shards)) writes the item with its configured
//! count if it is missing (a conditional put: of two first stores, one wins and the
//! other reads the winner's). From then on every store writes and claims over the
//! table's count, so no store can spread messages over shards the relays do not read.
//! A store whose count was set explicitly above the table's is refused (it was meant
//! for another table). Stores read the count again at every shard-lease round, and
//! otherwise when it is older than [`REFRESH_US`], so
//! [`grow_shards`](DynamoOutbox::grow_shards) reaches running stores without a restart.

use aws_sdk_dynamodb::types::{ReturnConsumedCapacity, ReturnValue};
use outbox_core::{Error, ErrorKind, Result};

use crate::config::MAX_SHARDS;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{get_n, n, now_us, s, Item, PK, SK};
use crate::store::DynamoOutbox;

const META_PK: &str = "c";
const META_SK: &str = "shards";
const SHARDS: &str = "shards";
const KEY_SHARDS: &str = "key_shards";

/// How long a store without shard leases trusts the table's count before it reads it
/// again (microseconds).
pub(crate) const REFRESH_US: u64 = 10_000_000;

/// The table's counts, as the meta item holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableShards {
    /// The `due` shards relays claim from.
    pub(crate) shards: u16,
    /// The order-marker partitions.
    pub(crate) key_shards: u16,
}

/// What a store last read of its table's counts, and when (microseconds).
#[derive(Debug, Default)]
pub(crate) struct KnownShards(std::sync::Mutex<Option<(TableShards, u64)>>);

impl KnownShards {
    fn get(&self) -> Option<(TableShards, u64)> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, table: TableShards) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((table, now_us()));
    }
}

fn meta_key() -> Item {
    Item::from([(PK.to_owned(), s(META_PK)), (SK.to_owned(), s(META_SK))])
}

/// The counts an item holds, or a schema error naming what is wrong with it.
fn decode(item: &Item, table: &str) -> Result<TableShards> {
    let count = |name: &str| -> Result<u16> {
        get_n::<u16>(item, name)
            .ok()
            .flatten()
            .filter(|c| (1..=MAX_SHARDS).contains(c))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Schema,
                    format!(
                        "table {table}: the shard-count item (pk = {META_PK}, sk = {META_SK}) \
                         has no valid {name} (1..={MAX_SHARDS})"
                    ),
                )
            })
    };
    Ok(TableShards {
        shards: count(SHARDS)?,
        key_shards: count(KEY_SHARDS)?,
    })
}

/// A store whose count was set (`set`) to `configured` is refused by a table of fewer
/// shards: it was meant for another table, or for one not grown yet.
fn refuse_more_than_table(
    configured: u16,
    set: bool,
    table: TableShards,
    name: &str,
) -> Result<()> {
    if set && configured > table.shards {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "this store is configured with {configured} shards but table {name} has {}: \
                 configure {} shards (or none: a store uses the table's count), or grow the \
                 table first (DynamoOutbox::grow_shards)",
                table.shards, table.shards
            ),
        ));
    }
    Ok(())
}

impl DynamoOutbox {
    /// Read the table's shard count (writing it with this store's count when the table
    /// has none yet) and check this store's configuration against it; returns the
    /// table's count, which this store then writes and claims over. [`install`](Self::install), the first claim and the first
    /// [`enqueue`](Self::enqueue) call it; call it once before
    /// [`enqueue_writes`](Self::enqueue_writes) when this store neither installs nor
    /// enqueued yet. One strongly consistent read (and one put the first time).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when this store's count was set above the table's (the
    /// message says what to do);
    /// [`ErrorKind::Schema`] when the table's count item is malformed; mapped SDK
    /// errors otherwise.
    pub async fn check_shards(&self) -> Result<u16> {
        Ok(self.refresh_shards().await?.shards)
    }

    /// Read the meta item again (pinning it when missing) and remember it.
    pub(crate) async fn refresh_shards(&self) -> Result<TableShards> {
        let table = match self.read_meta().await? {
            Some(table) => table,
            None => self.pin_meta().await?,
        };
        refuse_more_than_table(
            self.shards(),
            self.inner.config.shards_set(),
            table,
            self.table(),
        )?;
        self.inner.known.set(table);
        Ok(table)
    }

    /// The table's counts, read again when older than [`REFRESH_US`].
    pub(crate) async fn table_shards(&self) -> Result<TableShards> {
        match self.inner.known.get() {
            Some((table, at)) if now_us().saturating_sub(at) < REFRESH_US => Ok(table),
            _ => self.refresh_shards().await,
        }
    }

    /// The table's counts as last read, without a request.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when this store never read them.
    pub(crate) fn checked_shards(&self) -> Result<TableShards> {
        self.inner.known.get().map(|(t, _)| t).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "this store has not read table {}'s shard count yet: call install(), \
                     check_shards() or enqueue() once before enqueue_writes()",
                    self.table()
                ),
            )
        })
    }

    /// Grow the table's shard count to `to` while stores run: relays read the new
    /// count at their next shard-lease round (within a third of the lease; without
    /// shard leases within ten seconds) and claim from the new shards; writers read it
    /// within ten seconds of their next [`enqueue`](Self::enqueue) (a store that only
    /// sends [`enqueue_writes`](Self::enqueue_writes) keeps its count until its next
    /// [`check_shards`](Self::check_shards), which is harmless: the old shards are still
    /// read). Order markers stay where they are, so per-key order holds throughout.
    /// The count never shrinks. Returns the table's new count.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when `to` is outside 1..=[`MAX_SHARDS`] or below the
    /// table's count; mapped SDK errors otherwise.
    pub async fn grow_shards(&self, to: u16) -> Result<u16> {
        if to == 0 || to > MAX_SHARDS {
            return Err(Error::new(
                ErrorKind::Config,
                format!("shard count {to} is outside 1..={MAX_SHARDS}"),
            ));
        }
        let current = self.refresh_shards().await?;
        let sent = self
            .inner
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(meta_key()))
            .update_expression("SET #s = :to")
            .condition_expression("attribute_exists(#pk) AND #s <= :to")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#s", SHARDS)
            .expression_attribute_values(":to", n(to))
            .return_values(ReturnValue::AllNew)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record_upkeep(out.consumed_capacity());
                let table = decode(&out.attributes.unwrap_or_default(), self.table())?;
                self.inner.known.set(table);
                Ok(table.shards)
            }
            Err(e) if is_condition_failed(&e) => {
                let now = self.refresh_shards().await.unwrap_or(current);
                Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "table {} has {} shards; a shard count never shrinks (asked for {to})",
                        self.table(),
                        now.shards
                    ),
                ))
            }
            Err(e) => Err(from_sdk("grow shards", e)),
        }
    }

    async fn read_meta(&self) -> Result<Option<TableShards>> {
        let out = self
            .inner
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(meta_key()))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| from_sdk("read shard count", e))?;
        self.record_upkeep(out.consumed_capacity());
        out.item()
            .map(|item| decode(item, self.table()))
            .transpose()
    }

    /// Write the meta item with this store's count, unless another store just did;
    /// the counts the table then holds.
    async fn pin_meta(&self) -> Result<TableShards> {
        let mine = TableShards {
            shards: self.shards(),
            key_shards: self.shards(),
        };
        let mut item = meta_key();
        item.insert(SHARDS.to_owned(), n(mine.shards));
        item.insert(KEY_SHARDS.to_owned(), n(mine.key_shards));
        let sent = self
            .inner
            .client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record_upkeep(out.consumed_capacity());
                Ok(mine)
            }
            Err(e) if is_condition_failed(&e) => self.read_meta().await?.ok_or_else(|| {
                Error::new(
                    ErrorKind::Schema,
                    format!(
                        "table {}: the shard-count item vanished while it was written",
                        self.table()
                    ),
                )
            }),
            Err(e) => Err(from_sdk("write shard count", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(shards: &str, key_shards: &str) -> Item {
        let mut item = meta_key();
        item.insert(SHARDS.to_owned(), n(shards));
        item.insert(KEY_SHARDS.to_owned(), n(key_shards));
        item
    }

    #[test]
    fn counts_decode_within_range_only() {
        assert_eq!(
            decode(&item("32", "16"), "t").unwrap(),
            TableShards {
                shards: 32,
                key_shards: 16
            }
        );
        for (a, b) in [("0", "16"), ("16", "0"), ("257", "16"), ("x", "16")] {
            let e = decode(&item(a, b), "t").unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::Schema), "{a}/{b}: {e}");
        }
        let e = decode(&meta_key(), "t").unwrap_err();
        assert!(e.message().contains("no valid shards"), "{e}");
    }

    #[test]
    fn only_a_count_set_above_the_tables_is_refused() {
        let table = TableShards {
            shards: 16,
            key_shards: 16,
        };
        refuse_more_than_table(16, true, table, "t").unwrap();
        refuse_more_than_table(8, true, table, "t").unwrap();
        refuse_more_than_table(32, false, table, "t").unwrap();
        let e = refuse_more_than_table(17, true, table, "t").unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Config));
        assert!(
            e.message()
                .contains("configured with 17 shards but table t has 16"),
            "{e}"
        );
    }
}
