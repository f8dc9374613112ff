//! Shared helpers for the integration tests: a client for DynamoDB Local, isolated
//! tables, stale-table cleanup, fixtures.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{ConditionCheck, TransactWriteItem};
use aws_sdk_dynamodb::Client;
use outbox_core::{ErrorKind, NewMessage, OutboxAdmin, OutboxStore, Result, StoreCapabilities};
use outbox_dynamodb::{
    DynamoDedupConfig, DynamoDedupStore, DynamoEntityConfig, DynamoEntityStore, DynamoOutbox,
    DynamoOutboxConfig,
};
use outbox_testkit::{isolation, Features, Fixture, Harness};
use tokio::sync::OnceCell;

/// The variable naming the DynamoDB endpoint (DynamoDB Local in tests).
pub const URL_VAR: &str = "OUTBOX_DYNAMODB_URL";
/// Shards of the test tables: few, so a case's claims stay cheap, but more than one so
/// merging across shards is exercised.
pub const SHARDS: u16 = 4;

/// The endpoint, or `None` (after a visible skip line) when it is not set; a failure
/// instead under `OUTBOX_REQUIRE_INTEGRATION=1`.
pub fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url(URL_VAR, what)
}

/// A client for `url` with dummy static credentials, as DynamoDB Local accepts.
pub fn client_for(url: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(url)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("outbox", "outbox", None, None, "tests"))
        .build();
    Client::from_conf(config)
}

/// A client for the test endpoint (per test: each `#[tokio::test]` has its own runtime),
/// after deleting stale test tables once per binary.
pub async fn client(what: &str) -> Option<Client> {
    let url = url(what)?;
    let client = client_for(&url);
    drop_stale_tables(&client).await;
    Some(client)
}

/// A fresh table name, `obx_<unix seconds>_<random>_<what>`, so stale ones can be
/// deleted.
pub fn table_name(what: &str) -> String {
    format!("{}_{what}", isolation::unique_name())
}

async fn drop_stale_tables(client: &Client) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let mut start = None;
        loop {
            let Ok(out) = client
                .list_tables()
                .set_exclusive_start_table_name(start.take())
                .send()
                .await
            else {
                return;
            };
            for name in out.table_names() {
                if isolation::is_stale(name) {
                    let _ = client.delete_table().table_name(name).send().await;
                }
            }
            match out.last_evaluated_table_name() {
                Some(last) => start = Some(last.to_owned()),
                None => return,
            }
        }
    })
    .await;
}

/// An installed outbox in a table of its own.
pub async fn outbox(client: &Client, config: DynamoOutboxConfig) -> Result<DynamoOutbox> {
    let outbox = DynamoOutbox::new(
        client.clone(),
        config.with_table(table_name("outbox")).with_shards(SHARDS),
    )?;
    outbox.install().await?;
    Ok(outbox)
}

/// An installed dedup store in a table of its own.
pub async fn dedup(client: &Client, retention: Duration) -> Result<DynamoDedupStore> {
    let config = DynamoDedupConfig::default()
        .with_table(table_name("dedup"))
        .with_retention(retention);
    let store = DynamoDedupStore::new(client.clone(), config)?;
    store.install().await?;
    Ok(store)
}

/// An installed entity store in a table of its own.
pub async fn entities(client: &Client) -> Result<DynamoEntityStore> {
    let store = DynamoEntityStore::new(
        client.clone(),
        DynamoEntityConfig::default().with_table(table_name("entities")),
    )?;
    store.install().await?;
    Ok(store)
}

/// Most messages per transaction in [`enqueue_all`]: a keyed message under per-key
/// order takes three of the 100 actions (state, body, order marker).
pub const CHUNK: usize = 33;

/// Enqueue `messages`, all checked first (so an invalid one writes nothing), sent in
/// transactions of [`CHUNK`] messages.
pub async fn enqueue_all(outbox: &DynamoOutbox, messages: &[NewMessage]) -> Result<()> {
    outbox.enqueue_writes(messages)?;
    for chunk in messages.chunks(CHUNK) {
        outbox.enqueue(Vec::new(), chunk).await?;
    }
    Ok(())
}

/// A write of the caller's whose condition fails: a `ConditionCheck` that an item
/// exists which never does. A transaction holding it is cancelled whole.
pub fn failing_write(outbox: &DynamoOutbox) -> TransactWriteItem {
    let check = ConditionCheck::builder()
        .table_name(outbox.config().table())
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("no such item".into()),
        )
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("-".into()))
        .condition_expression("attribute_exists(pk)")
        .build()
        .expect("condition check");
    TransactWriteItem::builder().condition_check(check).build()
}

/// Runs the outbox conformance suite on a table per case.
#[derive(Debug)]
pub struct DynamoHarness {
    pub client: Client,
}

#[async_trait::async_trait]
impl Harness for DynamoHarness {
    fn features(&self) -> Features {
        let mut features = Features::all();
        // DynamoDB has no transaction that holds an item: nothing for claims to skip.
        features.row_locks = false;
        features
    }

    async fn fixture(&self, caps: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = DynamoOutboxConfig::default()
            .with_ordering(caps.ordering)
            .with_retention(caps.retention);
        Ok(Box::new(DynamoFixture(outbox(&self.client, config).await?)))
    }
}

/// One case's outbox.
#[derive(Debug)]
pub struct DynamoFixture(pub DynamoOutbox);

#[async_trait::async_trait]
impl Fixture for DynamoFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.0.clone())
    }
    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.0.clone())
    }
    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        enqueue_all(&self.0, &messages).await
    }
    /// A real cancelled transaction: the messages ride with a write of the caller's
    /// whose condition fails, so DynamoDB writes none of it.
    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let err = self
            .0
            .enqueue(vec![failing_write(&self.0)], &messages)
            .await
            .expect_err("the transaction must be cancelled");
        assert_eq!(err.kind(), ErrorKind::Conflict, "{}", err.report());
        Ok(())
    }
    /// The message's state item (key `m#<id>` / `s`, see the crate docs) gets a
    /// `done_us` of now, as a complete under `Keep` leaves it.
    async fn mark_dispatched(&self, id: outbox_core::MessageId) -> Result<()> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let sent = self
            .0
            .client()
            .update_item()
            .table_name(self.0.config().table())
            .key(
                "pk",
                AttributeValue::S(format!("m#{}", id.as_uuid().hyphenated())),
            )
            .key("sk", AttributeValue::S("s".into()))
            .update_expression("SET done_us = :now")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":now", AttributeValue::N(now.as_micros().to_string()))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Err(outbox_core::Error::invalid_input("no such message"))
            }
            Err(e) => Err(storage(e)),
        }
    }
}

/// A driver error as the storage error a test harness reports.
fn storage(e: impl std::error::Error + Send + Sync + 'static) -> outbox_core::Error {
    isolation::plumbing_error(e)
}
