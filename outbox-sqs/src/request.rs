//! One `SendMessageBatch` request: its entries, each entry's outcome from SQS's answer,
//! and the isolation of a bad entry when SQS refuses the whole request.

use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use outbox_core::{Error, PublishOutcome, Result};

use crate::attributes::Prepared;
use crate::error;

/// A message ready to send: its position, entry and FIFO group.
pub(crate) struct Ready {
    pub(crate) position: usize,
    /// The message id, the `MessageDeduplicationId` on FIFO queues.
    pub(crate) id: String,
    pub(crate) prepared: Prepared,
    pub(crate) group: Option<String>,
}

/// Why a whole `SendMessageBatch` failed.
pub(crate) struct Refused {
    pub(crate) error: Error,
    /// SQS refused it as invalid for what it carries (not for the queue, the
    /// credentials or its load), which may be one entry's fault.
    pub(crate) per_entry: bool,
}

/// Send `entries` (of the messages at `indices`) with `send` as one request and map
/// its outcomes back to the indices. When the request fails as a whole as invalid for
/// what it carries and holds more than one entry, each entry is made again with `one`
/// and sent alone, in order, so that a bad entry is the only permanent failure; any
/// other failure of the whole request is every entry's outcome.
pub(crate) async fn isolating<E, S, F>(
    indices: Vec<usize>,
    entries: Vec<E>,
    one: impl Fn(usize) -> Result<E>,
    send: S,
) -> Vec<(usize, PublishOutcome)>
where
    S: Fn(Vec<E>) -> F,
    F: std::future::Future<Output = std::result::Result<Vec<PublishOutcome>, Refused>>,
{
    let refused = match send(entries).await {
        Ok(outcomes) => return indices.into_iter().zip(outcomes).collect(),
        Err(refused) => refused,
    };
    if !refused.per_entry || indices.len() == 1 {
        let outcome = PublishOutcome::of_error(&refused.error);
        return indices.into_iter().map(|i| (i, outcome.clone())).collect();
    }
    let mut done = Vec::with_capacity(indices.len());
    for i in indices {
        let outcome = match one(i) {
            Ok(entry) => match send(vec![entry]).await {
                Ok(outcomes) => outcomes.into_iter().next().unwrap_or_else(|| {
                    PublishOutcome::Retryable("SQS reported nothing for the entry".into())
                }),
                Err(refused) => PublishOutcome::of_error(&refused.error),
            },
            Err(e) => PublishOutcome::of_error(&e),
        };
        done.push((i, outcome));
    }
    done
}

/// Each entry's outcome from a `SendMessageBatch` answer for `len` entries whose ids
/// are their positions: `Successful` is published; a `Failed` entry is permanent on a
/// sender fault and retryable otherwise; an entry in neither list is retryable.
pub(crate) fn entry_outcomes(
    output: &SendMessageBatchOutput,
    len: usize,
    queue: &str,
    what: &str,
) -> Vec<PublishOutcome> {
    let mut outcomes: Vec<Option<PublishOutcome>> = vec![None; len];
    for ok in output.successful() {
        if let Some(slot) = slot_of(ok.id(), len) {
            outcomes[slot] = Some(PublishOutcome::Published);
        }
    }
    for failed in output.failed() {
        if let Some(slot) = slot_of(failed.id(), len) {
            let e = error::entry_error(
                queue,
                failed.code(),
                failed.sender_fault(),
                failed.message(),
            );
            outcomes[slot] = Some(PublishOutcome::of_error(&e));
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                PublishOutcome::Retryable(format!(
                    "{what}: SQS reported neither success nor failure for the entry"
                ))
            })
        })
        .collect()
}

/// The entry's position in its request, from its `Id` (the position itself).
fn slot_of(id: &str, len: usize) -> Option<usize> {
    id.parse::<usize>().ok().filter(|&slot| slot < len)
}

/// The batch entry of `ready` at `slot` of its request. Entry ids are positions, not
/// message ids, so a message twice in one batch is two distinct entries.
pub(crate) fn entry(slot: usize, ready: &Ready) -> Result<SendMessageBatchRequestEntry> {
    let mut entry = SendMessageBatchRequestEntry::builder()
        .id(slot.to_string())
        .message_body(&ready.prepared.body);
    for (name, value) in &ready.prepared.attributes {
        let value = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .map_err(|e| {
                Error::invalid_input("a message attribute could not be built").with_source(e)
            })?;
        entry = entry.message_attributes(name, value);
    }
    if let Some(group) = &ready.group {
        entry = entry
            .message_deduplication_id(&ready.id)
            .message_group_id(group);
    }
    entry
        .build()
        .map_err(|e| Error::invalid_input("a batch entry could not be built").with_source(e))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use aws_sdk_sqs::types::{BatchResultErrorEntry, SendMessageBatchResultEntry};
    use outbox_core::ErrorKind;

    fn ok(id: &str) -> SendMessageBatchResultEntry {
        SendMessageBatchResultEntry::builder()
            .id(id)
            .message_id("m")
            .md5_of_message_body("x")
            .build()
            .unwrap()
    }

    fn failed(id: &str, code: &str, sender_fault: bool) -> BatchResultErrorEntry {
        BatchResultErrorEntry::builder()
            .id(id)
            .code(code)
            .sender_fault(sender_fault)
            .message("why")
            .build()
            .unwrap()
    }

    #[test]
    fn each_entry_gets_its_own_outcome() {
        // Entry 1 refused as the sender's fault, 3 failed on SQS's side, 4 missing,
        // and an id out of range ignored.
        let output = SendMessageBatchOutput::builder()
            .successful(ok("2"))
            .successful(ok("0"))
            .failed(failed("1", "InvalidParameterValue", true))
            .failed(failed("3", "InternalError", false))
            .successful(ok("9"))
            .build()
            .unwrap();
        let outcomes = entry_outcomes(&output, 5, "q", "SendMessageBatch to \"q\"");
        assert_eq!(outcomes[0], PublishOutcome::Published);
        assert!(
            matches!(&outcomes[1], PublishOutcome::Permanent(r) if r.contains("InvalidParameterValue: why")),
            "{:?}",
            outcomes[1]
        );
        assert_eq!(outcomes[2], PublishOutcome::Published);
        assert!(
            matches!(&outcomes[3], PublishOutcome::Retryable(r) if r.contains("InternalError")),
            "{:?}",
            outcomes[3]
        );
        assert!(
            matches!(&outcomes[4], PublishOutcome::Retryable(r) if r.contains("neither")),
            "{:?}",
            outcomes[4]
        );
    }

    #[test]
    fn entries_carry_dedup_and_group_ids_only_on_fifo() {
        let prepared = Prepared {
            body: "b".into(),
            attributes: vec![("outbox-message-id".into(), "id-1".into())],
            size: 1,
        };
        let standard = entry(
            3,
            &Ready {
                position: 7,
                id: "id-1".into(),
                prepared: prepared.clone(),
                group: None,
            },
        )
        .unwrap();
        assert_eq!(
            standard.id(),
            "3",
            "the entry id is the position in its request"
        );
        assert_eq!(standard.message_deduplication_id(), None);
        assert_eq!(standard.message_group_id(), None);
        let fifo = entry(
            0,
            &Ready {
                position: 7,
                id: "id-1".into(),
                prepared,
                group: Some("key".into()),
            },
        )
        .unwrap();
        assert_eq!(fifo.message_deduplication_id(), Some("id-1"));
        assert_eq!(fifo.message_group_id(), Some("key"));
        assert_eq!(
            fifo.message_attributes().unwrap()["outbox-message-id"].string_value(),
            Some("id-1")
        );
    }

    /// A request of `entries` (message indices) that SQS refuses as a whole when it
    /// holds index 2, with `per_entry` as given; `calls` records every request.
    async fn refusing(
        entries: Vec<usize>,
        per_entry: bool,
        calls: &Mutex<Vec<Vec<usize>>>,
    ) -> std::result::Result<Vec<PublishOutcome>, Refused> {
        calls.lock().unwrap().push(entries.clone());
        if entries.contains(&2) {
            let status = if per_entry {
                outbox_core::ErrorStatus::Permanent
            } else {
                outbox_core::ErrorStatus::Temporary
            };
            return Err(Refused {
                error: Error::new(ErrorKind::Publish, "refused").with_status(status),
                per_entry,
            });
        }
        Ok(vec![PublishOutcome::Published; entries.len()])
    }

    #[tokio::test]
    async fn one_bad_entry_of_a_refused_request_is_the_only_permanent_one() {
        let calls = Mutex::new(Vec::new());
        let done = isolating(
            vec![10, 11, 12, 13],
            vec![0, 1, 2, 3],
            |i| Ok(i - 10),
            |entries| refusing(entries, true, &calls),
        )
        .await;
        let positions: Vec<usize> = done.iter().map(|(i, _)| *i).collect();
        assert_eq!(positions, [10, 11, 12, 13]);
        for (i, outcome) in &done {
            if *i == 12 {
                assert!(
                    matches!(outcome, PublishOutcome::Permanent(_)),
                    "{outcome:?}"
                );
            } else {
                assert_eq!(*outcome, PublishOutcome::Published, "message {i}");
            }
        }
        assert_eq!(
            *calls.lock().unwrap(),
            [vec![0, 1, 2, 3], vec![0], vec![1], vec![2], vec![3]],
            "the whole request, then each entry alone in order"
        );
    }

    #[tokio::test]
    async fn a_request_refused_for_other_reasons_or_alone_is_not_sent_again() {
        let calls = Mutex::new(Vec::new());
        let done = isolating(vec![0, 1, 2], vec![0, 1, 2], Ok, |entries| {
            refusing(entries, false, &calls)
        })
        .await;
        assert!(done
            .iter()
            .all(|(_, o)| matches!(o, PublishOutcome::Retryable(_))));
        assert_eq!(calls.lock().unwrap().len(), 1);
        let calls = Mutex::new(Vec::new());
        let done = isolating(vec![7], vec![2], Ok, |entries| {
            refusing(entries, true, &calls)
        })
        .await;
        assert!(matches!(done[..], [(7, PublishOutcome::Permanent(_))]));
        assert_eq!(calls.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_entry_that_cannot_be_made_again_is_permanent_alone() {
        let calls = Mutex::new(Vec::new());
        let done = isolating(
            vec![0, 1, 2],
            vec![0, 1, 2],
            |i| {
                if i == 1 {
                    Err(Error::invalid_input("cannot build"))
                } else {
                    Ok(i)
                }
            },
            |entries| refusing(entries, true, &calls),
        )
        .await;
        assert_eq!(done[0].1, PublishOutcome::Published);
        assert!(matches!(&done[1].1, PublishOutcome::Permanent(r) if r.contains("cannot build")));
        assert!(matches!(&done[2].1, PublishOutcome::Permanent(r) if r.contains("refused")));
    }
}
