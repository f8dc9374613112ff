//! Table definitions and the idempotent creation helpers (on-demand billing, TTL).
//!
//! A table that already exists is checked, not changed (see `schema_check.rs`): its
//! keys, key types and global secondary indexes (keys and projections) must be the ones
//! this crate creates, it must have no local secondary index (an outbox table of layout
//! 1 has three), and time to live must be off or on the crate's attribute, or the
//! install fails with [`ErrorKind::Schema`].

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_dynamodb::Client;
use outbox_core::backend::Backoff;
use outbox_core::{Error, ErrorKind, Result};

use crate::error::{build_error, from_sdk};
use crate::item::{
    ATTEMPTS, AVAILABLE, CREATED, DEAD_ID, DEAD_INDEX, DONE_AT, DONE_INDEX, DUE, DUE_INDEX,
    PARTITION_KEY, PK, SHARD, SK, TOKEN, TTL,
};

/// How long an install waits for a new table to become `ACTIVE`.
const ACTIVE_DEADLINE: Duration = Duration::from_secs(300);

/// A table this crate (or one built on it) creates: keys, attribute types, global
/// secondary indexes, TTL, stream.
#[derive(Debug, Clone)]
pub struct TableSpec {
    /// The table's name.
    pub name: String,
    /// The partition key attribute.
    pub hash: &'static str,
    /// The sort key attribute, if any.
    pub range: Option<&'static str>,
    /// Key attributes of the table and its indexes, with their types.
    pub attributes: Vec<(&'static str, ScalarAttributeType)>,
    /// Global secondary indexes: `(index, partition key, sort key, projected non-key
    /// attributes)`; `None` projects all.
    pub indexes: Vec<(
        &'static str,
        &'static str,
        &'static str,
        Option<Vec<&'static str>>,
    )>,
    /// The time-to-live attribute, if any.
    pub ttl: Option<&'static str>,
    /// Whether the table has a stream carrying new images (`NEW_IMAGE`, or
    /// `NEW_AND_OLD_IMAGES` on an existing table).
    pub stream: bool,
}

impl TableSpec {
    /// The table as an operator reads it (DynamoDB has no DDL): keys, key attribute
    /// types, global secondary indexes and their projections, billing, TTL.
    pub(crate) fn describe(&self) -> String {
        let kind = |name: &str| {
            self.attributes
                .iter()
                .find(|(a, _)| *a == name)
                .map_or("?", |(_, t)| t.as_str())
                .to_owned()
        };
        let mut text = format!(
            "DynamoDB table {}
  partition key: {} ({})
",
            self.name,
            self.hash,
            kind(self.hash)
        );
        if let Some(range) = self.range {
            text.push_str(&format!(
                "  sort key: {range} ({})
",
                kind(range)
            ));
        }
        for (index, hash, sort, projected) in &self.indexes {
            let projection = match projected {
                None => "all attributes".to_owned(),
                Some(attrs) if attrs.is_empty() => "keys only".to_owned(),
                Some(attrs) => format!("keys and {}", attrs.join(", ")),
            };
            text.push_str(&format!(
                "  global secondary index {index}: partition key {hash} ({}), sort key {sort} ({}), \
                 projecting {projection}\n",
                kind(hash),
                kind(sort)
            ));
        }
        text.push_str("  billing: on demand (pay per request)\n");
        if self.stream {
            text.push_str("  stream: enabled, view type NEW_IMAGE\n");
        }
        if let Some(ttl) = self.ttl {
            text.push_str(&format!("  time to live: attribute {ttl}\n"));
        }
        text
    }
}

/// The outbox table (layout 2): `pk`/`sk` strings, three sparse global indexes keyed
/// by the write-sharded `shard` attribute of state items, TTL on the body items' `ttl`.
pub(crate) fn outbox_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash: PK,
        range: Some(SK),
        attributes: vec![
            (PK, ScalarAttributeType::S),
            (SK, ScalarAttributeType::S),
            (SHARD, ScalarAttributeType::S),
            (DUE, ScalarAttributeType::N),
            (DEAD_ID, ScalarAttributeType::S),
            (DONE_AT, ScalarAttributeType::N),
        ],
        indexes: vec![
            (
                DUE_INDEX,
                SHARD,
                DUE,
                Some(vec![ATTEMPTS, PARTITION_KEY, TOKEN, CREATED, AVAILABLE]),
            ),
            (DEAD_INDEX, SHARD, DEAD_ID, None),
            (DONE_INDEX, SHARD, DONE_AT, Some(vec![])),
        ],
        ttl: Some(TTL),
        stream: false,
    }
}

/// The dedup table (layout 2): one `pk` string per record, no index, TTL on `ttl`.
pub(crate) fn dedup_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash: PK,
        range: None,
        attributes: vec![(PK, ScalarAttributeType::S)],
        indexes: vec![],
        ttl: Some(crate::dedup::TTL),
        stream: false,
    }
}

/// The entity table: one item per entity under the `pk` string.
pub(crate) fn entity_table(name: &str) -> TableSpec {
    keyed_table(name)
}

/// The lock table: one lease item per lock name under the `pk` string.
pub(crate) fn lock_table(name: &str) -> TableSpec {
    keyed_table(name)
}

/// A table of items under a `pk` string alone: no sort key, no index, no TTL.
fn keyed_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash: PK,
        range: None,
        attributes: vec![(PK, ScalarAttributeType::S)],
        indexes: vec![],
        ttl: None,
        stream: false,
    }
}

/// Refuse a table replicated by Global Tables for a store that promises strongly
/// consistent decisions: a strongly consistent read or conditional write is only
/// consistent within its own region's replica, and concurrent writes in two regions
/// are reconciled by "last writer wins", so two holders (or two first records) could
/// both succeed.
pub(crate) async fn refuse_replicas(client: &Client, table: &str, what: &str) -> Result<()> {
    let described = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| from_sdk("describe table", e))?;
    match described.table() {
        Some(t) => check_not_replicated(t, what),
        None => Err(Error::new(
            ErrorKind::Schema,
            "describe table returned no table",
        )),
    }
}

/// The decision of [`refuse_replicas`] on a table description.
pub(crate) fn check_not_replicated(
    table: &aws_sdk_dynamodb::types::TableDescription,
    what: &str,
) -> Result<()> {
    let regions: Vec<&str> = table
        .replicas()
        .iter()
        .filter_map(|r| r.region_name())
        .collect();
    if regions.is_empty() {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{what} table {} is a Global Table replicated to {regions:?}: strongly consistent \
             reads and conditional writes do not hold across replicas, so it cannot back a \
             strongly consistent {what}; use a table of one region",
            table.table_name().unwrap_or("?")
        )))
    }
}

fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(|e| build_error("create table", e))
}

/// Create the table of `spec` on demand (pay per request) if it is missing, wait until
/// it is active, enable its TTL; check an existing table's keys and indexes.
///
/// # Errors
/// [`ErrorKind::Schema`] when the table exists with another layout; mapped SDK errors.
pub async fn install(client: &Client, spec: &TableSpec) -> Result<()> {
    let mut request = client
        .create_table()
        .table_name(&spec.name)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(key(spec.hash, KeyType::Hash)?);
    if let Some(range) = spec.range {
        request = request.key_schema(key(range, KeyType::Range)?);
    }
    if spec.stream {
        request = request.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .map_err(|e| build_error("create table", e))?,
        );
    }
    for (name, kind) in &spec.attributes {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(*name)
                .attribute_type(kind.clone())
                .build()
                .map_err(|e| build_error("create table", e))?,
        );
    }
    for (index, hash, sort, projected) in &spec.indexes {
        let projection = match projected {
            None => Projection::builder().projection_type(ProjectionType::All),
            Some(attrs) if attrs.is_empty() => {
                Projection::builder().projection_type(ProjectionType::KeysOnly)
            }
            Some(attrs) => attrs.iter().fold(
                Projection::builder().projection_type(ProjectionType::Include),
                |p, a| p.non_key_attributes(*a),
            ),
        };
        request = request.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(*index)
                .key_schema(key(hash, KeyType::Hash)?)
                .key_schema(key(sort, KeyType::Range)?)
                .projection(projection.build())
                .build()
                .map_err(|e| build_error("create table", e))?,
        );
    }
    match request.send().await {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) => return Err(from_sdk("create table", e)),
    }
    wait_active(client, spec).await?;
    if let Some(attr) = spec.ttl {
        enable_ttl(client, &spec.name, attr).await?;
    }
    Ok(())
}

async fn wait_active(client: &Client, spec: &TableSpec) -> Result<()> {
    let start = Instant::now();
    let mut pause = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let described = client
            .describe_table()
            .table_name(&spec.name)
            .send()
            .await
            .map_err(|e| from_sdk("describe table", e))?;
        let table = described
            .table()
            .ok_or_else(|| Error::new(ErrorKind::Schema, "describe table returned no table"))?;
        crate::schema_check::check_layout(spec, table)?;
        if table.table_status() == Some(&TableStatus::Active) {
            return Ok(());
        }
        if start.elapsed() > ACTIVE_DEADLINE {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "table {} did not become active in {ACTIVE_DEADLINE:?}",
                    spec.name
                ),
            ));
        }
        pause.wait().await;
    }
}

async fn enable_ttl(client: &Client, table: &str, attr: &str) -> Result<()> {
    let current = client
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
        .map_err(|e| from_sdk("describe time to live", e))?;
    if let Some(desc) = current.time_to_live_description() {
        let on = matches!(
            desc.time_to_live_status(),
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
        );
        match desc.attribute_name() {
            Some(name) if on && name == attr => return Ok(()),
            // A table has one time-to-live attribute: turning it over to ours would
            // stop the expiry the table's other items rely on.
            Some(name) if on => {
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!(
                        "table {table} expires items by attribute {name}; this store needs                          time to live on {attr}: use a table of its own"
                    ),
                ))
            }
            _ => {}
        }
    }
    let spec = TimeToLiveSpecification::builder()
        .enabled(true)
        .attribute_name(attr)
        .build()
        .map_err(|e| build_error("update time to live", e))?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(spec)
        .send()
        .await
        .map_err(|e| from_sdk("update time to live", e))?;
    Ok(())
}

/// Delete a table (tests and tear-down tools); a missing table is not an error.
///
/// # Errors
/// Mapped SDK errors.
pub async fn drop_table(client: &Client, table: &str) -> Result<()> {
    match client.delete_table().table_name(table).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(from_sdk("delete table", e)),
    }
}

/// The outbox table, for tools.
#[async_trait::async_trait]
impl outbox_core::schema::Schema for crate::DynamoOutbox {
    fn name(&self) -> String {
        self.table().to_owned()
    }

    fn ddl(&self) -> String {
        outbox_table(self.table()).describe()
    }

    /// 2: small state items found through write-sharded global indexes, bodies
    /// written once (layout 1 kept everything in one item under three local indexes).
    fn layout_version(&self) -> u32 {
        2
    }

    async fn install(&self) -> Result<()> {
        crate::DynamoOutbox::install(self).await
    }
}

/// A consumer's inbox table, for tools.
#[async_trait::async_trait]
impl outbox_core::schema::Schema for crate::DynamoDedupStore {
    fn name(&self) -> String {
        self.config().table().to_owned()
    }

    fn ddl(&self) -> String {
        dedup_table(self.config().table()).describe()
    }

    /// 2: one item per record under its own partition key, expiring by TTL.
    fn layout_version(&self) -> u32 {
        2
    }

    async fn install(&self) -> Result<()> {
        crate::DynamoDedupStore::install(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_indexes_are_sparse_keys_declared() {
        let spec = outbox_table("t_outbox");
        for (_, hash, sort, _) in &spec.indexes {
            assert!(spec.attributes.iter().any(|(a, _)| a == sort), "{sort}");
            assert!(spec.attributes.iter().any(|(a, _)| a == hash), "{hash}");
        }
        assert_eq!(spec.indexes.len(), 3);
        assert_eq!(spec.ttl, Some(TTL));
        assert!(dedup_table("t").ttl.is_some());
        assert!(dedup_table("t").range.is_none() && dedup_table("t").indexes.is_empty());
        assert!(entity_table("t").range.is_none());
        assert!(lock_table("t").range.is_none() && lock_table("t").ttl.is_none());
    }

    #[test]
    fn replicated_tables_are_refused() {
        use aws_sdk_dynamodb::types::{ReplicaDescription, TableDescription};
        let single = TableDescription::builder().table_name("t").build();
        check_not_replicated(&single, "lock").unwrap();
        let global = TableDescription::builder()
            .table_name("t")
            .replicas(
                ReplicaDescription::builder()
                    .region_name("eu-west-1")
                    .build(),
            )
            .replicas(
                ReplicaDescription::builder()
                    .region_name("us-east-1")
                    .build(),
            )
            .build();
        let err = check_not_replicated(&global, "lock").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("eu-west-1"), "{err}");
    }

    #[test]
    fn the_description_names_keys_indexes_and_ttl() {
        let outbox = outbox_table("orders").describe();
        assert!(outbox.starts_with("DynamoDB table orders\n"), "{outbox}");
        assert!(
            outbox.contains(&format!("partition key: {PK} (S)")),
            "{outbox}"
        );
        assert!(outbox.contains(&format!("sort key: {SK} (S)")), "{outbox}");
        assert!(
            outbox.contains(&format!(
                "global secondary index {DUE_INDEX}: partition key {SHARD} (S), sort key {DUE} (N)"
            )),
            "{outbox}"
        );
        assert!(outbox.contains("keys only"), "{outbox}");
        assert!(outbox.contains("time to live: attribute ttl"), "{outbox}");
        assert!(!lock_table("l").describe().contains("time to live"));
        let dedup = dedup_table("inbox").describe();
        assert!(!dedup.contains("sort key"), "{dedup}");
        assert!(
            dedup.contains(&format!("time to live: attribute {}", crate::dedup::TTL)),
            "{dedup}"
        );
    }
}
