//! One shard's reader: `GetRecords` in a loop from the lease's checkpoint, messages
//! published with retries and dead letters, the checkpoint moved after each read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodbstreams::types::{OperationType, Record};
use futures::StreamExt;
use outbox_core::backend::Backoff;
use outbox_core::relay::PublishStage;
use outbox_core::{Error, Message, MessageId, PublishOutcome, Result};
use tokio_util::sync::CancellationToken;

use crate::config::StreamRelayConfig;
use crate::item::{self, get_s, message_id, micros, parts_of, FIRST_PART, PK, SK};
use crate::leases::LeaseTable;
use crate::lineage::Position;
use crate::meters::Meters;
use crate::outbox::{StreamDeadLetter, StreamOutbox};
use crate::sequence::SequenceNumber;
use crate::stream::{self, ReadError};

/// What every reader of one relay shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) outbox: StreamOutbox,
    pub(crate) streams: aws_sdk_dynamodbstreams::Client,
    pub(crate) stage: PublishStage,
    pub(crate) config: StreamRelayConfig,
    pub(crate) meters: Meters,
    pub(crate) counts: Counts,
}

/// What the relay did, counted by its readers.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) published: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) panics: AtomicU64,
    pub(crate) records_read: AtomicU64,
    pub(crate) shards_finished: AtomicU64,
}

impl Counts {
    fn add(slot: &AtomicU64, n: u64) {
        slot.fetch_add(n, Ordering::Relaxed);
    }
}

/// How a reader ended.
#[derive(Debug)]
pub(crate) enum ReaderEnd {
    /// The shard was read to its end and checkpointed so (its lease given up).
    Finished,
    /// Another worker took the lease: this one stopped writing to it.
    Lost,
    /// Stopped by the relay (shutdown, or a lease lost at renewal), after
    /// checkpointing what was published.
    Stopped,
    /// The stream no longer holds records after the checkpoint: the lease was marked
    /// trimmed; the error says how to recover.
    Trimmed(Error),
}

/// A lease a reader works under.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) shard: String,
    pub(crate) counter: u64,
    pub(crate) position: Position,
}

/// A message read from a record, with the record's position.
pub(crate) struct Read {
    pub(crate) message: Message,
    pub(crate) seq: SequenceNumber,
}

/// The decoded content of one `GetRecords`.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) messages: Vec<Read>,
    /// Records of message items that do not decode: dead-lettered, never published.
    pub(crate) undecodable: Vec<StreamDeadLetter>,
    /// The last record's sequence number and commit time (microseconds).
    pub(crate) last: Option<(SequenceNumber, Option<u64>)>,
}

/// Read `held.shard` from its checkpoint until its end, a lost lease, a trimmed
/// stream, a permanent error, or `stop`.
pub(crate) async fn read_shard(
    shared: Arc<Shared>,
    leases: LeaseTable,
    held: Held,
    stop: CancellationToken,
) -> Result<ReaderEnd> {
    let Held {
        shard,
        counter,
        mut position,
    } = held;
    let age = shared.meters.iterator_age(&shard);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut iterator: Option<String> = None;
    // Whether `iterator` was opened at the position just now (not carried over from
    // earlier reads): a trimmed answer to such an iterator is believed.
    let mut fresh = false;
    // A position read past but not yet written, with its commit time.
    let mut unsaved: Option<Option<u64>> = None;
    let mut saved_at = Instant::now();
    loop {
        if stop.is_cancelled() {
            return stopped(&leases, &shard, counter, &position, unsaved).await;
        }
        let current = match iterator.take() {
            Some(it) => it,
            None => match stream::iterator(&shared.streams, leases.stream(), &shard, &position)
                .await
            {
                Ok(Some(it)) => {
                    fresh = true;
                    it
                }
                Ok(None) => return finish(&shared, &leases, &shard, counter).await,
                Err(ReadError::Trimmed(e)) => return trimmed(&leases, &shard, counter, e).await,
                Err(ReadError::Expired) => continue,
                Err(ReadError::Other(e)) => {
                    wait_or_stop(e, &mut backoff, &stop).await?;
                    continue;
                }
            },
        };
        let out = match stream::read(&shared.streams, &current, shared.config.records_per_read)
            .await
        {
            Ok(out) => out,
            // Opened again at the position (which covers what this reader read).
            Err(ReadError::Expired) => continue,
            Err(ReadError::Trimmed(e)) if fresh => {
                return trimmed(&leases, &shard, counter, e).await
            }
            // An iterator carried over from earlier reads: open one at the position
            // and ask again before concluding the stream lost records. DynamoDB
            // Local answers so to the iterators it handed out for an empty shard
            // once records arrive.
            Err(ReadError::Trimmed(e)) => {
                tracing::debug!(shard, error = %e.report(), "stream relay: trimmed answer to a carried iterator; opening one at the position");
                continue;
            }
            Err(ReadError::Other(e)) => {
                wait_or_stop(e, &mut backoff, &stop).await?;
                iterator = Some(current);
                continue;
            }
        };
        backoff.reset();
        fresh = false;
        let next = out.next_shard_iterator;
        let records = out.records.unwrap_or_default();
        Counts::add(&shared.counts.records_read, records.len() as u64);
        shared.meters.records_read.increment(records.len() as u64);
        let empty = records.is_empty();
        if !empty {
            let batch = match decode(&shared, &shard, records).await {
                Ok(batch) => batch,
                Err(e) => {
                    // A part could not be read: read these records again.
                    wait_or_stop(e, &mut backoff, &stop).await?;
                    continue;
                }
            };
            let (last, at) = batch
                .last
                .clone()
                .expect("a batch of records has a last one");
            let any = !batch.messages.is_empty() || !batch.undecodable.is_empty();
            match settle(&shared, &shard, batch, &stop).await {
                Ok(true) => {}
                // Stopped during a retry's wait: nothing after the checkpoint counts.
                Ok(false) => return stopped(&leases, &shard, counter, &position, unsaved).await,
                Err(e) => {
                    wait_or_stop(e, &mut backoff, &stop).await?;
                    continue;
                }
            }
            position = Position::After(last);
            if let Some(at) = at {
                age.set(item::now_us().saturating_sub(at) as f64 / 1e6);
            }
            if any || saved_at.elapsed() >= shared.config.idle_checkpoint {
                if !leases.checkpoint(&shard, counter, &position, at).await? {
                    return Ok(ReaderEnd::Lost);
                }
                unsaved = None;
                saved_at = Instant::now();
            } else {
                unsaved = Some(at);
            }
        } else {
            age.set(0.0);
        }
        let Some(next) = next else {
            if let Some(at) = unsaved.take() {
                if !leases.checkpoint(&shard, counter, &position, at).await? {
                    return Ok(ReaderEnd::Lost);
                }
            }
            return finish(&shared, &leases, &shard, counter).await;
        };
        iterator = Some(next);
        if empty {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(shared.config.poll_interval) => {}
            }
        }
    }
}

/// Wait out a retryable error (or give up on a permanent one); `Err` also when stop
/// came first, which the caller's loop turns into a clean stop at its top.
async fn wait_or_stop(e: Error, backoff: &mut Backoff, stop: &CancellationToken) -> Result<()> {
    if !e.is_retryable() {
        return Err(e);
    }
    tracing::warn!(error = %e.report(), "stream relay: reading a shard failed; retrying");
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(backoff.next_delay()) => {}
    }
    Ok(())
}

async fn stopped(
    leases: &LeaseTable,
    shard: &str,
    counter: u64,
    position: &Position,
    unsaved: Option<Option<u64>>,
) -> Result<ReaderEnd> {
    if let Some(at) = unsaved {
        if !leases.checkpoint(shard, counter, position, at).await? {
            return Ok(ReaderEnd::Lost);
        }
    }
    Ok(ReaderEnd::Stopped)
}

async fn finish(
    shared: &Shared,
    leases: &LeaseTable,
    shard: &str,
    counter: u64,
) -> Result<ReaderEnd> {
    if !leases
        .checkpoint(shard, counter, &Position::End, None)
        .await?
    {
        return Ok(ReaderEnd::Lost);
    }
    Counts::add(&shared.counts.shards_finished, 1);
    tracing::info!(shard, "stream relay: shard read to its end");
    Ok(ReaderEnd::Finished)
}

async fn trimmed(leases: &LeaseTable, shard: &str, counter: u64, e: Error) -> Result<ReaderEnd> {
    tracing::error!(shard, error = %e.report(), "stream relay: the stream was trimmed past the checkpoint");
    leases.mark_trimmed(shard, counter).await?;
    Ok(ReaderEnd::Trimmed(e))
}

/// The dead-letter id of a record that is not a readable message: the same every
/// time the record is read (an FNV-1a hash of shard and sequence number).
fn record_id(shard: &str, seq: &str) -> MessageId {
    let hash = |seed: u64, text: &str| {
        text.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let mut bytes = [0_u8; 16];
    bytes[..8].copy_from_slice(&hash(0xcbf2_9ce4_8422_2325, shard).to_be_bytes());
    bytes[8..].copy_from_slice(&hash(0x8422_2325_cbf2_9ce4, seq).to_be_bytes());
    MessageId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// The messages of `records`: `INSERT` records of a message's first item, others
/// skipped (later parts, modifications, TTL removals, dead letters). A split message's
/// other parts are read from the table.
async fn decode(shared: &Shared, shard: &str, records: Vec<Record>) -> Result<Batch> {
    let mut batch = Batch::default();
    for record in records {
        let inserted = record.event_name() == Some(&OperationType::Insert);
        let Some(change) = record.dynamodb else {
            continue;
        };
        let Some(seq) = change.sequence_number().and_then(SequenceNumber::parse) else {
            continue;
        };
        let at = change
            .approximate_creation_date_time()
            .map(|t| u64::try_from(t.to_millis().unwrap_or(0)).unwrap_or(0) * 1000);
        batch.last = Some((seq.clone(), at));
        if !inserted {
            continue;
        }
        let Some(image) = change.new_image else {
            continue;
        };
        let first = item::item_from_stream(image);
        let is_message = get_s(&first, PK).is_some_and(|pk| pk.starts_with("m#"))
            && get_s(&first, SK) == Some(FIRST_PART);
        if !is_message {
            continue;
        }
        let decoded = match message_id(&first) {
            None => Err((
                record_id(shard, seq.as_str()),
                "the id does not decode".to_owned(),
            )),
            Some(id) => {
                let rest = if parts_of(&first) > 1 {
                    shared.outbox.read_parts(id).await?
                } else {
                    Vec::new()
                };
                item::decode_message(&first, &rest)
                    .and_then(|m| {
                        m.check_stored(shared.outbox.config().limits())
                            .map(|()| m)
                            .map_err(|e| e.to_string())
                    })
                    .map_err(|reason| (id, reason))
            }
        };
        match decoded {
            Ok(message) => {
                if let Some((_, at)) = batch.last.as_mut() {
                    // The writer's clock is finer than the stream's minute-grained one.
                    *at = Some(micros(message.created_at));
                }
                batch.messages.push(Read { message, seq });
            }
            Err((id, reason)) => batch.undecodable.push(StreamDeadLetter {
                id,
                destination: get_s(&first, item::DESTINATION)
                    .unwrap_or_default()
                    .to_owned(),
                reason: format!("undecodable message item: {reason}"),
                attempts: 0,
                dead_at: std::time::SystemTime::now(),
                shard: shard.to_owned(),
                sequence_number: seq.to_string(),
            }),
        }
    }
    Ok(batch)
}

/// Publish a batch's messages until each is published or dead-lettered, and write the
/// dead letters. `false` when `stop` came during a retry's wait.
pub(crate) async fn settle(
    shared: &Shared,
    shard: &str,
    batch: Batch,
    stop: &CancellationToken,
) -> Result<bool> {
    for dead in &batch.undecodable {
        dead_letter(shared, dead).await?;
    }
    // Messages and their records' positions side by side, so each call hands the
    // publisher a slice of the messages without copying them.
    let (mut pending, mut seqs): (Vec<Message>, Vec<SequenceNumber>) = batch
        .messages
        .into_iter()
        .map(|r| (r.message, r.seq))
        .unzip();
    let mut attempt: u32 = 1;
    while !pending.is_empty() {
        for message in &mut pending {
            message.attempts = attempt;
        }
        let outcomes = publish(shared, &pending).await;
        let (mut retry, mut retry_seqs) = (Vec::new(), Vec::new());
        let mut published = 0_u64;
        for ((message, seq), outcome) in pending.into_iter().zip(seqs).zip(outcomes) {
            let reason = match outcome {
                PublishOutcome::Published => {
                    published += 1;
                    continue;
                }
                PublishOutcome::Retryable(_) if attempt < shared.config.retry.max_attempts => {
                    Counts::add(&shared.counts.retried, 1);
                    shared.meters.retried.increment(1);
                    retry.push(message);
                    retry_seqs.push(seq);
                    continue;
                }
                PublishOutcome::Retryable(reason) => {
                    Counts::add(&shared.counts.retried, 1);
                    shared.meters.retried.increment(1);
                    format!("gave up after {attempt} attempts: {reason}")
                }
                PublishOutcome::Permanent(reason) => reason,
            };
            dead_letter(
                shared,
                &StreamDeadLetter {
                    id: message.id,
                    destination: message.destination,
                    reason,
                    attempts: attempt,
                    dead_at: std::time::SystemTime::now(),
                    shard: shard.to_owned(),
                    sequence_number: seq.to_string(),
                },
            )
            .await?;
        }
        Counts::add(&shared.counts.published, published);
        shared.meters.dispatched.increment(published);
        if retry.is_empty() {
            break;
        }
        let wait = shared.config.retry.delay(attempt);
        tokio::select! {
            () = stop.cancelled() => return Ok(false),
            () = tokio::time::sleep(wait) => {}
        }
        attempt += 1;
        pending = retry;
        seqs = retry_seqs;
    }
    Ok(true)
}

async fn dead_letter(shared: &Shared, dead: &StreamDeadLetter) -> Result<()> {
    tracing::warn!(id = %dead.id, shard = dead.shard, reason = dead.reason, "stream relay: dead-lettering a message");
    shared.outbox.write_dead_letter(dead).await?;
    Counts::add(&shared.counts.dead_lettered, 1);
    shared.meters.dead_lettered.increment(1);
    Ok(())
}

/// One outcome per message: calls of `batch_size`, `publish_concurrency` in flight.
async fn publish(shared: &Shared, messages: &[Message]) -> Vec<PublishOutcome> {
    let calls: Vec<_> = messages
        .chunks(shared.config.batch_size)
        .map(|chunk| shared.stage.publish(chunk))
        .collect();
    let answers: Vec<_> = futures::stream::iter(calls)
        .buffered(shared.config.publish_concurrency)
        .collect()
        .await;
    let mut outcomes = Vec::with_capacity(messages.len());
    for answer in answers {
        if answer.panicked {
            Counts::add(&shared.counts.panics, 1);
            shared.meters.panics.increment(1);
        }
        outcomes.extend(answer.outcomes);
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_ids_are_stable_and_distinct() {
        let a = record_id("shardId-1", "000000000000000000001");
        assert_eq!(a, record_id("shardId-1", "000000000000000000001"));
        assert_ne!(a, record_id("shardId-1", "000000000000000000002"));
        assert_ne!(a, record_id("shardId-2", "000000000000000000001"));
    }
}
