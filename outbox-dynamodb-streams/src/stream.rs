//! The DynamoDB Streams API as the relay uses it: listing a stream's shards, opening
//! an iterator at a checkpoint, reading records, and what each failure means.

use aws_sdk_dynamodbstreams::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsOutput;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use aws_sdk_dynamodbstreams::Client;
use outbox_core::{Error, ErrorKind, Result};
use outbox_dynamodb::kit::from_sdk;

use crate::lineage::Position;

/// A shard as the stream lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamShard {
    pub(crate) id: String,
    pub(crate) parent: Option<String>,
}

/// Why a read failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The iterator is older than 15 minutes: open a new one at the position.
    Expired,
    /// The records after the position are gone from the stream (past its 24-hour
    /// retention), or the shard is: reading on would skip them.
    Trimmed(Error),
    /// Anything else, mapped.
    Other(Error),
}

fn classify<E, R>(what: &str, e: SdkError<E, R>) -> ReadError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let code = e
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .map(str::to_owned);
    match code.as_deref() {
        Some("ExpiredIteratorException") => ReadError::Expired,
        Some("TrimmedDataAccessException" | "ResourceNotFoundException") => {
            ReadError::Trimmed(trimmed_error(what, code.as_deref().unwrap_or_default(), e))
        }
        _ => ReadError::Other(from_sdk(what, e)),
    }
}

fn trimmed_error<E>(what: &str, code: &str, source: E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    Error::new(
        ErrorKind::Storage,
        format!(
            "{what} failed ({code}): the stream no longer holds the records after the \
             shard's checkpoint (a relay down longer than the stream's 24-hour retention); \
             nothing was skipped: recover with StreamRelay::recover_trimmed, which publishes \
             the message items newer than the checkpoint again from the table"
        ),
    )
    .with_status(outbox_core::ErrorStatus::Permanent)
    .with_source(source)
}

/// Every shard of `stream`, page after page.
pub(crate) async fn list_shards(client: &Client, stream: &str) -> Result<Vec<StreamShard>> {
    let mut shards = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let out = client
            .describe_stream()
            .stream_arn(stream)
            .set_exclusive_start_shard_id(start.take())
            .send()
            .await
            .map_err(|e| from_sdk("describe the stream", e))?;
        let Some(description) = out.stream_description else {
            return Ok(shards);
        };
        for shard in description.shards() {
            if let Some(id) = shard.shard_id() {
                shards.push(StreamShard {
                    id: id.to_owned(),
                    parent: shard.parent_shard_id().map(str::to_owned),
                });
            }
        }
        match description.last_evaluated_shard_id {
            Some(last) if !last.is_empty() => start = Some(last),
            _ => return Ok(shards),
        }
    }
}

/// An iterator of `shard` at `position` (its oldest record when nothing was
/// checkpointed, the record after the checkpoint otherwise).
pub(crate) async fn iterator(
    client: &Client,
    stream: &str,
    shard: &str,
    position: &Position,
) -> std::result::Result<Option<String>, ReadError> {
    let request = client
        .get_shard_iterator()
        .stream_arn(stream)
        .shard_id(shard);
    let request = match position {
        Position::TrimHorizon => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
        Position::After(seq) => request
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(seq.as_str()),
        Position::End => return Ok(None),
    };
    request
        .send()
        .await
        .map(|out| out.shard_iterator)
        .map_err(|e| classify("open a shard iterator", e))
}

/// One `GetRecords` of at most `limit` records.
pub(crate) async fn read(
    client: &Client,
    iterator: &str,
    limit: i32,
) -> std::result::Result<GetRecordsOutput, ReadError> {
    client
        .get_records()
        .shard_iterator(iterator)
        .limit(limit)
        .send()
        .await
        .map_err(|e| classify("read a stream shard", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trimmed_error_is_permanent_and_names_the_recovery() {
        let e = trimmed_error(
            "read",
            "TrimmedDataAccessException",
            std::io::Error::other("x"),
        );
        assert_eq!(e.kind(), ErrorKind::Storage);
        assert!(!e.is_retryable());
        assert!(e.message().contains("recover_trimmed"), "{}", e.message());
        assert!(e.message().contains("TrimmedDataAccessException"));
    }
}
