//! Shared helpers for the integration tests: the server URL, isolated streams, the
//! publisher harness.

#![allow(dead_code, unreachable_pub)]

pub mod private;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use outbox_core::{Error, ErrorKind, Headers, Publisher, Result};
use outbox_nats::async_nats::jetstream::{self, stream};
use outbox_nats::{
    NatsPublisher, NatsPublisherConfig, CONTENT_TYPE_HEADER, MESSAGE_ID_HEADER,
    PARTITION_KEY_HEADER,
};
use outbox_testkit::{PublisherHarness, PublisherNamespace, Received, RestartableNamespace};
use private::PrivateNats;
use tokio::sync::OnceCell;

/// The variable naming the NATS server.
pub const URL_VAR: &str = "OUTBOX_NATS_URL";
/// How long test streams are kept before a later run deletes them.
const STREAM_TTL_SECS: u64 = 3600;
/// What the routed part of a namespace is called.
const ROUTED: &str = "routed";

/// The server URL, or `None` (after a visible skip line) when it is not set.
pub fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url(URL_VAR, what)
}

/// `service_test!` for the tests that need the server, on a runtime of two workers:
/// ignored, with this reason, when `OUTBOX_NATS_URL` was not set at build time. Each
/// test awaits its fixture first (a future of `Option`: `None` skips it), for example
/// [`service_url`].
#[allow(unused_macros)]
macro_rules! nats_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_NATS_URL was not set at build time (see the build warning)";
            flavor = multi_thread(2);
            $($tests)*
        }
    };
}

/// [`url`], as a `nats_test!` fixture.
pub async fn service_url(what: &str) -> Option<String> {
    url(what)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A fresh stream name and subject prefix, `obx_<unix seconds>_<random>`, so stale
/// ones can be deleted.
pub fn unique_name() -> String {
    format!("obx_{}_{:012x}", now_secs(), fastrand::u64(..1 << 48))
}

fn test_error(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::Unavailable, format!("test plumbing: {what}")).with_source(e)
}

/// A plain client and its JetStream context, for the test's own stream management.
pub async fn jetstream(url: &str) -> jetstream::Context {
    let client = outbox_nats::async_nats::connect(url)
        .await
        .expect("connect to OUTBOX_NATS_URL");
    let js = jetstream::new(client);
    delete_stale_streams(&js).await;
    js
}

/// Delete test streams older than an hour (left by failed cases), once per test binary.
async fn delete_stale_streams(js: &jetstream::Context) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        use futures::TryStreamExt;
        let names: Vec<String> = js.stream_names().try_collect().await.expect("list streams");
        let cutoff = now_secs().saturating_sub(STREAM_TTL_SECS);
        for name in names {
            let secs = name
                .strip_prefix("obx_")
                .and_then(|rest| rest.split('_').next())
                .and_then(|secs| secs.parse::<u64>().ok());
            if secs.is_some_and(|secs| secs < cutoff) {
                let _ = js.delete_stream(&name).await;
            }
        }
    })
    .await;
}

/// A stream named `name` storing `<name>.<routed>.>` in memory, duplicates dropped for
/// two minutes.
pub async fn create_stream(js: &jetstream::Context, name: &str, routed: &str) {
    create_stream_in(js, name, routed, stream::StorageType::Memory).await;
}

/// [`create_stream`] with the storage given: a stream that must outlive a server
/// restart is stored in files.
pub async fn create_stream_in(
    js: &jetstream::Context,
    name: &str,
    routed: &str,
    storage: stream::StorageType,
) {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.{routed}.>")],
        storage,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .expect("create the test stream");
}

/// Runs the publisher suite against the live JetStream: a stream and subject prefix
/// per case.
#[derive(Debug, Clone)]
pub struct NatsHarness {
    pub url: String,
}

#[async_trait]
impl PublisherHarness for NatsHarness {
    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>> {
        let js = jetstream(&self.url).await;
        let name = unique_name();
        create_stream(&js, &name, ROUTED).await;
        Ok(Box::new(NatsNamespace {
            url: self.url.clone(),
            js,
            name,
            server: None,
        }))
    }

    async fn restartable_namespace(&self) -> Result<Box<dyn RestartableNamespace>> {
        let server = PrivateNats::start().await?;
        let js = jetstream(&server.url()).await;
        let name = unique_name();
        create_stream_in(&js, &name, ROUTED, stream::StorageType::File).await;
        Ok(Box::new(NatsNamespace {
            url: server.url(),
            js,
            name,
            server: Some(server),
        }))
    }
}

/// One stream, `<name>`, storing subjects `<name>.routed.>`; publishers use the
/// subject prefix `<name>`.
#[derive(Debug)]
pub struct NatsNamespace {
    url: String,
    js: jetstream::Context,
    name: String,
    /// The private server a restartable namespace runs on, `None` on the shared one.
    server: Option<PrivateNats>,
}

/// How long a publisher on a private server waits for an ack: short, so a publish the
/// server's death interrupts returns soon.
const PRIVATE_ACK_TIMEOUT: Duration = Duration::from_secs(2);

impl NatsNamespace {
    pub fn config(&self) -> NatsPublisherConfig {
        let config = NatsPublisherConfig::new(&self.url).with_subject_prefix(&self.name);
        match self.server {
            Some(_) => config.with_ack_timeout(PRIVATE_ACK_TIMEOUT),
            None => config,
        }
    }

    fn server(&self) -> Result<&PrivateNats> {
        self.server
            .as_ref()
            .ok_or_else(|| Error::config("this namespace is on the shared server"))
    }
}

#[async_trait]
impl RestartableNamespace for NatsNamespace {
    async fn stop_broker(&self) -> Result<()> {
        self.server()?.stop()
    }

    async fn start_broker(&self) -> Result<()> {
        self.server()?.start_again().await
    }
}

#[async_trait]
impl PublisherNamespace for NatsNamespace {
    async fn publisher(&self) -> Result<Arc<dyn Publisher>> {
        Ok(Arc::new(NatsPublisher::connect(self.config()).await?))
    }

    fn destination(&self, name: &str) -> String {
        format!("{ROUTED}.{name}")
    }

    fn unroutable_destination(&self) -> String {
        "unrouted.nowhere".to_owned()
    }

    async fn received(&self, destination: &str) -> Result<Vec<Received>> {
        read_back(
            &self.js,
            &self.name,
            &format!("{}.{destination}", self.name),
        )
        .await
    }

    async fn teardown(&self) -> Result<()> {
        self.js
            .delete_stream(&self.name)
            .await
            .map_err(|e| test_error("delete the test stream", e))?;
        Ok(())
    }
}

/// Every message of `stream` on `subject`, in stream order, decoded back.
pub async fn read_back(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Vec<Received>> {
    let stream = js
        .get_stream(stream)
        .await
        .map_err(|e| test_error("get the test stream", e))?;
    let state = stream.cached_info().state.clone();
    let mut received = Vec::new();
    if state.messages == 0 {
        return Ok(received);
    }
    for seq in state.first_sequence..=state.last_sequence {
        let m = stream
            .get_raw_message(seq)
            .await
            .map_err(|e| test_error("read a stored message", e))?;
        if m.subject.as_str() != subject {
            continue;
        }
        let mut headers = Headers::new();
        let (mut dedup_id, mut content_type, mut key) = (None, None, None);
        for (name, values) in m.headers.iter() {
            assert_eq!(
                values.len(),
                1,
                "header {name} arrived {} times",
                values.len()
            );
            let value = values[0].as_str().to_owned();
            match name.to_string().as_str() {
                MESSAGE_ID_HEADER => dedup_id = Some(value),
                CONTENT_TYPE_HEADER => content_type = Some(value),
                PARTITION_KEY_HEADER => key = Some(value),
                other => headers.insert(other, value),
            }
        }
        received.push(
            Received::new(m.payload.to_vec())
                .with_dedup_id(dedup_id)
                .with_content_type(content_type)
                .with_partition_key(key)
                .with_headers(headers),
        );
    }
    Ok(received)
}
