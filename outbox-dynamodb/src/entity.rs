//! [`DynamoEntityStore`]: the entity store of the decoupled consumer
//! ([`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer)), one item per
//! entity.
//!
//! # Protocol
//!
//! 1. **Load**: `GetItem` with `ConsistentRead = true`: the record (`state` and `outbox`
//!    as JSON text) and its `version` number.
//! 2. **Persist**: one `PutItem` whose condition is the optimistic check:
//!    `attribute_not_exists(pk)` to create (version 1), `version = :expected` to replace
//!    (version + 1). DynamoDB applies conditional writes to an item one at a time, so
//!    of concurrent persists from one version at most one succeeds; the others get
//!    [`Persisted::Conflict`].
//! 3. **Size**: the item is measured before sending; over DynamoDB's 400 KB item limit
//!    the persist fails with [`ErrorKind::InvalidInput`] and nothing is written.
//!
//! ## Staying under 400 KB
//!
//! The item holds the business state *and* the outgoing messages of the messages being
//! processed (the outbox state), payloads included (base64 in JSON, a third larger than
//! the bytes). Between messages the outbox state is empty, so the peak is the state
//! plus one handler's outgoing messages, plus entries a crash left behind until the
//! next cleanup. Keep the state small (history belongs in its own items or tables),
//! send few and small messages per handler, and put large bodies in S3 with a
//! reference in the message. Processed ids do not grow the item: they live in the
//! [`DynamoDedupStore`](crate::DynamoDedupStore).
//!
//! ## Limitations
//!
//! - Every message of an entity rewrites its whole item twice (with, then without, the
//!   outbox state): write units grow with the item's size.
//! - Do not delete an entity that may still receive messages: re-created, its versions
//!   start over at 1.

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use outbox_core::consumer::{EntityRecord, EntityStore, Loaded, Persisted, Version};
use outbox_core::{EntityKey, Error, ErrorKind, Result};

use crate::config::DynamoEntityConfig;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{get_n, get_s, item_size, n, s, Item, MAX_ITEM_BYTES, PK};

const STATE: &str = "state";
const OUTBOX: &str = "outbox";
const VERSION: &str = "version";

/// Entities of a [`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer) in a
/// DynamoDB table, with optimistic concurrency on a `version` attribute.
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client) -> outbox_core::Result<()> {
/// use outbox_dynamodb::{DynamoEntityConfig, DynamoEntityStore};
///
/// let entities = DynamoEntityStore::new(client, DynamoEntityConfig::default().with_table("accounts"))?;
/// entities.install().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoEntityStore {
    client: Client,
    config: DynamoEntityConfig,
}

impl DynamoEntityStore {
    /// A store over `client` with `config`. Sends nothing.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for a bad table name.
    pub fn new(client: Client, config: DynamoEntityConfig) -> Result<Self> {
        config.validate()?;
        Ok(DynamoEntityStore { client, config })
    }

    /// Create the table if missing (on-demand billing) and wait until it is active.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`] when the table exists with another key;
    /// [`ErrorKind::Config`] when it is a Global Table (it lists replicas: versioned
    /// conditional writes do not hold across regions); mapped SDK errors otherwise.
    pub async fn install(&self) -> Result<()> {
        crate::schema::install(
            &self.client,
            &crate::schema::entity_table(self.config.table()),
        )
        .await?;
        crate::schema::refuse_replicas(&self.client, self.config.table(), "entity store").await
    }

    /// Delete the table. A missing table is not an error.
    ///
    /// # Errors
    /// Mapped SDK errors.
    pub async fn drop_table(&self) -> Result<()> {
        crate::schema::drop_table(&self.client, self.config.table()).await
    }
}

/// The item for `record` at `version`, refused over DynamoDB's item limit.
pub(crate) fn entity_item(
    key: &EntityKey,
    record: &EntityRecord,
    version: Version,
) -> Result<Item> {
    let outbox = serde_json::to_string(&record.outbox)
        .map_err(|e| Error::invalid_input("the outbox state does not serialize").with_source(e))?;
    let item = Item::from([
        (PK.to_owned(), s(key.as_str())),
        (STATE.to_owned(), s(record.state.to_string())),
        (OUTBOX.to_owned(), s(outbox)),
        (VERSION.to_owned(), n(version.get())),
    ]);
    let size = item_size(&item);
    if size > MAX_ITEM_BYTES {
        return Err(Error::invalid_input(format!(
            "entity {key} would be an item of {size} bytes, over DynamoDB's item limit of \
             {MAX_ITEM_BYTES}: keep the state small and outgoing payloads few and small \
             (see the DynamoEntityStore docs)"
        )));
    }
    Ok(item)
}

#[async_trait]
impl EntityStore for DynamoEntityStore {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        let out = self
            .client
            .get_item()
            .table_name(self.config.table())
            .key(PK, s(key.as_str()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| from_sdk("load entity", e))?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        let decode = |what: &str| {
            Error::new(
                ErrorKind::Decode,
                format!("the {what} of entity {key} does not decode"),
            )
        };
        let state = get_s(&item, STATE).ok_or_else(|| decode("state"))?;
        let state = serde_json::from_str(state).map_err(|e| decode("state").with_source(e))?;
        let outbox = get_s(&item, OUTBOX).ok_or_else(|| decode("outbox state"))?;
        let outbox =
            serde_json::from_str(outbox).map_err(|e| decode("outbox state").with_source(e))?;
        let version: u64 = get_n(&item, VERSION)?.ok_or_else(|| decode("version"))?;
        Ok(Some(Loaded {
            record: EntityRecord { state, outbox },
            version: Version::new(version),
        }))
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        let version = match expected {
            None => Version::new(1),
            Some(v) => v.next()?,
        };
        let item = entity_item(key, record, version)?;
        let request = self
            .client
            .put_item()
            .table_name(self.config.table())
            .set_item(Some(item));
        let request = match expected {
            None => request
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PK),
            Some(v) => request
                .condition_expression("#v = :expected")
                .expression_attribute_names("#v", VERSION)
                .expression_attribute_values(":expected", n(v.get())),
        };
        match request.send().await {
            Ok(_) => Ok(Persisted::Stored(version)),
            Err(e) if is_condition_failed(&e) => Ok(Persisted::Conflict),
            Err(e) => Err(from_sdk("persist entity", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversize_entities_are_refused_before_sending() {
        let key = EntityKey::new("acct-1").unwrap();
        let mut record = EntityRecord {
            state: serde_json::json!({ "balance": 10 }),
            ..EntityRecord::default()
        };
        let item = entity_item(&key, &record, Version::new(3)).unwrap();
        assert_eq!(item[VERSION].as_n().unwrap(), "3");
        record.state = serde_json::Value::String("x".repeat(MAX_ITEM_BYTES));
        let err = entity_item(&key, &record, Version::new(1)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("item limit"), "{err}");
    }
}
