//! A trimmed stream: the relay stops with the documented error instead of skipping,
//! and the recovery publishes what the stream lost from the table.
//!
//! DynamoDB Local keeps every record (no 24-hour trim), so an interceptor on the real
//! Streams client answers `GetRecords` with the `TrimmedDataAccessException` AWS
//! sends for an iterator past the trim horizon; the request itself still reaches
//! DynamoDB Local.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aws_smithy_types::config_bag::{Storable, StoreReplace};
use outbox_core::{ErrorKind, NewMessage};
use outbox_dynamodb_streams::aws_sdk_dynamodbstreams::config::http::HttpResponse;
use outbox_dynamodb_streams::aws_sdk_dynamodbstreams::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use outbox_dynamodb_streams::aws_sdk_dynamodbstreams::config::{
    ConfigBag, Intercept, RuntimeComponents,
};
use outbox_dynamodb_streams::aws_sdk_dynamodbstreams::error::BoxError;
use outbox_dynamodb_streams::{StreamRelay, REPLAY_MARGIN};
use outbox_testkit::RecordingPublisher;

use crate::common::{self, Running};

/// Answers every `GetRecords` with `TrimmedDataAccessException` while on.
#[derive(Debug, Clone, Default)]
struct Trim(Arc<AtomicBool>);

/// Whether the attempt is a `GetRecords` (the request is gone by the time the answer
/// is read).
#[derive(Debug, Clone)]
struct GetRecords(bool);

impl Storable for GetRecords {
    type Storer = StoreReplace<Self>;
}

impl Intercept for Trim {
    fn name(&self) -> &'static str {
        "Trim"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context.request().headers().get("x-amz-target");
        cfg.interceptor_state().store_put(GetRecords(
            target.is_some_and(|t| t.ends_with(".GetRecords")),
        ));
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let get_records = cfg.load::<GetRecords>().is_some_and(|g| g.0);
        if !get_records || !self.0.load(Ordering::SeqCst) {
            return Ok(());
        }
        let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#TrimmedDataAccessException","message":"The operation attempted to read past the oldest stream record in a shard."}"#;
        let mut response = HttpResponse::new(400.try_into()?, body.into());
        response
            .headers_mut()
            .insert("content-type", "application/x-amz-json-1.0");
        response
            .headers_mut()
            .insert("content-length", body.len().to_string());
        *context.response_mut() = response;
        Ok(())
    }
}

fn messages(n: usize, destination: &str) -> Vec<NewMessage> {
    (0..n)
        .map(|_| {
            NewMessage::builder(destination)
                .payload(b"x".to_vec())
                .build()
                .unwrap()
        })
        .collect()
}

streams_test! {
    async fn a_trimmed_stream_stops_the_relay_and_the_recovery_replays_from_the_table(
        (url, outbox) = common::url_and_outbox("stream relay: trimmed", "trim")
    ) {
        let trim = Trim::default();
        let streams = outbox_dynamodb_streams::aws_sdk_dynamodbstreams::Client::from_conf(
            common::streams_config(&url)
                .interceptor(trim.clone())
                .build(),
        );
        let publisher = RecordingPublisher::new();
        let relay = Running::start(
            &outbox,
            streams.clone(),
            Arc::new(publisher.clone()),
            common::relay_config(),
        );
        let early = messages(5, "early");
        outbox.enqueue(Vec::new(), &early).await.unwrap();
        publisher
            .wait_for_unique(5, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        // The relay "was down" past the retention: the records after its checkpoint are gone.
        trim.0.store(true, Ordering::SeqCst);
        let lost = messages(7, "lost");
        outbox.enqueue(Vec::new(), &lost).await.unwrap();
        let e = outbox_testkit::wait::within("the relay to stop", relay.task)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Storage);
        assert!(!e.is_retryable());
        assert!(e.message().contains("recover_trimmed"), "{}", e.message());
        assert_eq!(
            publisher.unique_count(),
            5,
            "nothing after the checkpoint was published"
        );
        // A relay started now stops too: the lease is marked until the recovery.
        trim.0.store(false, Ordering::SeqCst);
        let recovery = StreamRelay::new(
            outbox.clone(),
            streams.clone(),
            Arc::new(publisher.clone()),
            common::relay_config(),
        )
        .unwrap();
        let replayed = recovery.recover_trimmed().await.unwrap();
        // Everything since the checkpoint's time less the margin: the lost seven, and the
        // early five again (they are within the margin).
        assert!(REPLAY_MARGIN.as_secs() >= 60);
        assert_eq!(replayed, 12);
        assert_eq!(publisher.unique_count(), 12);
        // Nothing is marked any more: a second recovery replays nothing.
        assert_eq!(recovery.recover_trimmed().await.unwrap(), 0);
        // The shard is read again from its oldest record: everything once more, and new
        // messages flow.
        let relay = Running::start(
            &outbox,
            streams,
            Arc::new(publisher.clone()),
            common::relay_config(),
        );
        let after = messages(3, "after");
        outbox.enqueue(Vec::new(), &after).await.unwrap();
        publisher
            .wait_for_unique(15, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        relay.shutdown().await;
        outbox.drop_tables().await.unwrap();
    }
}
