//! The stream as one session reads it: [`Stream`] (the transaction being read, the
//! committed messages waiting, the positions they settle), decoding replication events
//! into it, dead-lettering the log records under the outbox prefix that are not
//! published (undecodable, non-transactional), and confirming to the server the
//! position up to which everything is settled (protocol steps 3 and 5 of
//! [`WalRelay`]).

use std::collections::VecDeque;
use std::time::SystemTime;

use outbox_core::{Message, MessageId, Result};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};

use super::{WalRelay, NON_TRANSACTIONAL_DESTINATION, UNDECODABLE_DESTINATION};
use crate::codec;
use crate::outbox::{pg_time, DeadLetterRow};

/// One session's view of the stream.
pub(super) struct Stream {
    /// Inside a transaction (between `BEGIN` and `COMMIT`).
    in_txn: bool,
    /// The current transaction's commit time.
    commit_time: SystemTime,
    /// The current transaction's messages, publishable at its commit.
    txn: Vec<Message>,
    /// Committed messages waiting to be published, in commit order.
    pub(super) ready: VecDeque<Message>,
    /// Per message in `ready`: the position to confirm once it (and all before it) is
    /// settled: its transaction's end for the last message of a transaction.
    ends: VecDeque<Option<Lsn>>,
    /// A position past which nothing is waiting, once `ready` drains.
    passed: Option<Lsn>,
    /// The highest position whose messages are all settled.
    settled_to: Option<Lsn>,
    /// The position last handed to the client.
    pub(super) confirmed: Lsn,
}

impl Stream {
    pub(super) fn new(confirmed: Lsn) -> Self {
        Stream {
            in_txn: false,
            commit_time: SystemTime::UNIX_EPOCH,
            txn: Vec::new(),
            ready: VecDeque::new(),
            ends: VecDeque::new(),
            passed: None,
            settled_to: None,
            confirmed,
        }
    }

    fn push(&mut self, message: Message, end: Option<Lsn>) {
        self.ready.push_back(message);
        self.ends.push_back(end);
    }

    /// Everything up to `lsn` was read and holds nothing new of the outbox: confirm it
    /// with the last waiting message, or once nothing waits.
    fn passed(&mut self, lsn: Lsn) {
        match self.ends.back_mut() {
            Some(end) => *end = Some(lsn.max(end.unwrap_or(Lsn::ZERO))),
            None => self.passed = Some(lsn.max(self.passed.unwrap_or(Lsn::ZERO))),
        }
    }

    /// Take the first waiting message off `ready`, settled (published or
    /// dead-lettered): the position it carries, if any, is settled with it.
    pub(super) fn settle_front(&mut self) -> Message {
        let message = self.ready.pop_front().expect("settled within the batch");
        if let Some(end) = self.ends.pop_front().expect("one end per message") {
            self.settled_to = Some(end);
        }
        message
    }

    /// Commit time of the oldest message waiting.
    pub(super) fn oldest(&self) -> Option<SystemTime> {
        self.ready.front().map(|m| m.created_at)
    }
}

impl WalRelay {
    /// Fold one event into the stream's state.
    pub(super) async fn apply(
        &mut self,
        stream: &mut Stream,
        event: ReplicationEvent,
    ) -> Result<()> {
        match event {
            ReplicationEvent::Begin {
                commit_time_micros, ..
            } => {
                stream.in_txn = true;
                stream.commit_time = pg_time(commit_time_micros);
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } if prefix == self.outbox.config().prefix() => {
                if !transactional {
                    // Emitted outside any transaction's commit (not by `enqueue`): it
                    // is decoded even when the emitting transaction rolled back, so it
                    // is never published. Kept as a dead letter for the operator.
                    self.dead_letter_raw(
                        lsn,
                        &content,
                        SystemTime::now(),
                        NON_TRANSACTIONAL_DESTINATION,
                        "non-transactional logical message under the outbox prefix: \
                         it is decoded even if its transaction rolled back, so it is not \
                         published"
                            .to_owned(),
                    )
                    .await?;
                    return Ok(());
                }
                // Content from another tool may decode and still break the message
                // rules (oversize, NUL or control characters): such a message could
                // neither be published nor stored as it is.
                let limits = self.outbox.config().limits();
                let decoded = codec::decode(&content, stream.commit_time, 1)
                    .and_then(|m| m.check_stored(limits).map(|()| m));
                match decoded {
                    Ok(message) => stream.txn.push(message),
                    Err(reason) => {
                        // Not ours to publish, but never skipped silently: it goes to
                        // the dead letters with its raw content.
                        self.dead_letter_raw(
                            lsn,
                            &content,
                            stream.commit_time,
                            UNDECODABLE_DESTINATION,
                            format!("undecodable logical message: {reason}"),
                        )
                        .await?;
                    }
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                stream.in_txn = false;
                let messages = std::mem::take(&mut stream.txn);
                let count = messages.len();
                for (i, message) in messages.into_iter().enumerate() {
                    stream.push(message, (i + 1 == count).then_some(end_lsn));
                }
                if count == 0 {
                    stream.passed(end_lsn);
                }
            }
            ReplicationEvent::KeepAlive { wal_end, .. } if !stream.in_txn => {
                stream.passed(wal_end);
            }
            _ => {}
        }
        Ok(())
    }

    /// Write a log record under the outbox prefix that is not published (undecodable
    /// or non-transactional) to the dead letters, with its raw content as the payload.
    /// Its id is derived from the slot and the record's position, so a record read
    /// again after a resume is the same dead letter, not a second one.
    async fn dead_letter_raw(
        &mut self,
        lsn: Lsn,
        content: &[u8],
        at: SystemTime,
        destination: &str,
        reason: String,
    ) -> Result<()> {
        let message = Message::from(outbox_core::backend::MessageParts {
            id: record_id(self.outbox.config().slot(), lsn),
            destination: destination.to_owned(),
            partition_key: None,
            payload: content.to_vec(),
            content_type: None,
            headers: outbox_core::Headers::new(),
            created_at: at,
            attempts: 0,
            last_error: None,
        });
        tracing::warn!(%lsn, destination, %reason, "wal relay: dead-lettering a log record");
        self.outbox
            .write_dead_letters(&[DeadLetterRow { message, reason }])
            .await?;
        self.report.dead_lettered += 1;
        self.meters.dead_lettered.increment(1);
        Ok(())
    }

    /// Report the settled position to the server (sent within `status_interval`).
    pub(super) fn confirm(&mut self, client: &ReplicationClient, stream: &mut Stream) {
        if stream.ready.is_empty() {
            if let Some(passed) = stream.passed.take() {
                stream.settled_to = stream.settled_to.max(Some(passed));
            }
        }
        if let Some(lsn) = stream.settled_to {
            if lsn > stream.confirmed {
                client.update_applied_lsn(lsn);
                stream.confirmed = lsn;
                self.resume_from = self.resume_from.max(lsn);
            }
        }
    }
}

/// The dead-letter id of the log record at `lsn` read from `slot`: the same every time
/// the record is read (64 bits of the slot name's FNV-1a hash, then the position; the
/// version and variant bits overwrite 6 bits, 2 of them the position's top bits,
/// reached after 2^62 bytes of log).
fn record_id(slot: &str, lsn: Lsn) -> MessageId {
    let hash = slot.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let mut bytes = [0_u8; 16];
    bytes[..8].copy_from_slice(&hash.to_be_bytes());
    bytes[8..].copy_from_slice(&lsn.as_u64().to_be_bytes());
    MessageId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}
