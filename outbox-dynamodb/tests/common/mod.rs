//! Shared helpers for the integration tests: a client for DynamoDB Local, isolated
//! tables, stale-table cleanup, fixtures.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{BatchStatementErrorCodeEnum, ConditionCheck, TransactWriteItem};
use aws_sdk_dynamodb::Client;
use outbox_core::{
    store::StoreCapabilities, ErrorKind, NewMessage, OutboxAdmin, OutboxStore, Result,
};
use outbox_dynamodb::faults::{CancelReason, Fault, FaultInjector, Rule};
use outbox_dynamodb::{
    DynamoDedupConfig, DynamoDedupStore, DynamoEntityConfig, DynamoEntityStore, DynamoOutbox,
    DynamoOutboxConfig,
};
use outbox_testkit::{isolation, Fixture, Harness};
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

/// `service_test!` for the tests that need DynamoDB, on a runtime of two workers:
/// ignored, with this reason, when `OUTBOX_DYNAMODB_URL` was not set at build time.
/// Each test awaits its fixture first (a future of `Option`: `None` skips it), for
/// example [`client`] or [`client_and_outbox`].
#[allow(unused_macros)]
macro_rules! dynamo_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_DYNAMODB_URL was not set at build time (see the build warning)";
            flavor = multi_thread(2);
            $($tests)*
        }
    };
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

/// A `dynamo_test!` fixture: a [`client`] and an [`outbox`] of `config` on it.
pub async fn client_and_outbox(
    what: &str,
    config: DynamoOutboxConfig,
) -> Option<(Client, DynamoOutbox)> {
    let client = client(what).await?;
    let outbox = outbox(&client, config).await.unwrap();
    Some((client, outbox))
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
    outbox.check_shards().await?;
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

/// Share of the attempts of each data-plane operation throttled under the fault mix,
/// half with `ThrottlingException`, half with `ProvisionedThroughputExceededException`.
pub const THROTTLE_RATE: f64 = 0.05;
/// Share of `BatchExecuteStatement` requests (the batched completes) with one statement
/// failing with `ThrottlingError` under the fault mix.
pub const STATEMENT_RATE: f64 = 0.05;
/// Share of enqueue transactions cancelled for a `TransactionConflict` under the fault
/// mix.
pub const CONFLICT_RATE: f64 = 0.01;

/// The seeded mix of AWS's faults the suites run under a second time: throttles of
/// every data-plane attempt at [`THROTTLE_RATE`], one failed statement of a batched
/// complete at [`STATEMENT_RATE`], and enqueue transactions cancelled for a conflict at
/// [`CONFLICT_RATE`], all before the request is applied (as AWS refuses a throttled
/// request). No lagging index: the conformance cases claim once after a settle and
/// expect to see it (read-your-writes), which a lagging index does not give; the
/// lagging index has its own tests (`tests/dynamodb/faults.rs`). Seeded from `OUTBOX_FAULT_SEED` when set (to replay a run),
/// otherwise at random; the seed is printed.
pub fn fault_mix(what: &str) -> FaultInjector {
    let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
    faults.throttle_data_plane(THROTTLE_RATE);
    faults.add(
        Rule::fail_statement(BatchStatementErrorCodeEnum::ThrottlingError).rate(STATEMENT_RATE),
    );
    // Enqueue transactions are the ones that carry body items (`payload`).
    faults.add(
        Rule::cancel_transaction(CancelReason::TransactionConflict)
            .matching("\"payload\"")
            .rate(CONFLICT_RATE),
    );
    eprintln!(
        "{what}: fault injection seed {} (replay with OUTBOX_FAULT_SEED={})",
        faults.seed(),
        faults.seed()
    );
    faults
}

/// The SDK's retries under the fault mix: standard mode, 10 attempts, backoff from
/// 5 ms to 200 ms. They absorb nearly every throttle, as a client configured for
/// DynamoDB should; what is not retried (a cancelled transaction, a failed batch
/// statement) reaches the store.
pub fn fault_retries() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(10)
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_backoff(Duration::from_millis(200))
}

/// `client` with `faults` registered and the retries of [`fault_retries`].
pub fn faulty_client(client: &Client, faults: &FaultInjector) -> Client {
    let client = faults.client(client);
    Client::from_conf(
        client
            .config()
            .to_builder()
            .retry_config(fault_retries())
            .build(),
    )
}

/// Runs the outbox conformance suite on a table per case, plainly or under faults.
#[derive(Debug)]
pub struct DynamoHarness {
    pub client: Client,
    /// Under the fault mix: the injector registered on `client`.
    pub faults: Option<FaultInjector>,
}

impl DynamoHarness {
    /// The suite on `client` as it is.
    pub fn plain(client: Client) -> Self {
        DynamoHarness {
            client,
            faults: None,
        }
    }

    /// The suite on `client` under a fresh [`fault_mix`].
    pub fn under_faults(client: &Client, what: &str) -> Self {
        let faults = fault_mix(what);
        DynamoHarness {
            client: faulty_client(client, &faults),
            faults: Some(faults),
        }
    }
}

#[async_trait::async_trait]
impl Harness for DynamoHarness {
    async fn fixture(&self, caps: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = DynamoOutboxConfig::default()
            .with_ordering(caps.ordering)
            .with_retention(caps.retention);
        Ok(Box::new(DynamoFixture(
            outbox(&self.client, config).await?,
            self.faults.clone(),
        )))
    }
}

/// One case's outbox, and the injector when it runs under faults.
#[derive(Debug)]
pub struct DynamoFixture(pub DynamoOutbox, pub Option<FaultInjector>);

/// Most times the fixture sends an enqueue that failed with a retryable error.
const ENQUEUE_TRIES: usize = 10;

impl Drop for DynamoFixture {
    /// Under faults, print what was injected into the case (shown when it fails).
    fn drop(&mut self) {
        if let Some(faults) = &self.1 {
            eprintln!("{faults}");
        }
    }
}

#[async_trait::async_trait]
impl Fixture for DynamoFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.0.clone())
    }
    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.0.clone())
    }
    /// As [`enqueue_all`]; under faults, a transaction that failed retryably (an
    /// injected conflict) is sent again, as a caller retries a retryable enqueue. Only
    /// that transaction: the ones before it committed. The conflicts are injected
    /// before the transaction is applied, so a retry never finds its messages stored.
    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        if self.1.is_none() {
            return enqueue_all(&self.0, &messages).await;
        }
        self.0.check_shards().await?;
        self.0.enqueue_writes(&messages)?;
        for chunk in messages.chunks(CHUNK) {
            let mut tries = 0;
            loop {
                match self.0.enqueue(Vec::new(), chunk).await {
                    Err(e) if e.is_retryable() && tries < ENQUEUE_TRIES => tries += 1,
                    done => break done?,
                }
            }
        }
        Ok(())
    }
    /// A real cancelled transaction: the messages ride with a write of the caller's
    /// whose condition fails, so DynamoDB writes none of it.
    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tries = 0;
        let err = loop {
            let err = self
                .0
                .enqueue(vec![failing_write(&self.0)], &messages)
                .await
                .expect_err("the transaction must be cancelled");
            if self.1.is_some() && err.is_retryable() && tries < ENQUEUE_TRIES {
                tries += 1;
                continue;
            }
            break err;
        };
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

/// Backdate the lease of `name` (the documented item: key `pk` = the name, lease end in
/// `expires_us`), keeping its owner and fence: the holder's next renewal is refused.
pub async fn lapse_lock(admin: &Client, table: &str, name: &outbox_core::LockName) -> Result<()> {
    admin
        .update_item()
        .table_name(table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(name.as_str().to_owned()),
        )
        .update_expression("SET expires_us = :past")
        .condition_expression("attribute_exists(pk)")
        .expression_attribute_values(
            ":past",
            aws_sdk_dynamodb::types::AttributeValue::N("1".into()),
        )
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            outbox_core::Error::new(
                outbox_core::ErrorKind::Storage,
                format!("lapse {name:?}: {e:?}"),
            )
        })
}
