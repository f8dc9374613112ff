//! [`SqsPublisher`]: `SendMessageBatch` in chunks of ten, FIFO dedup and group ids
//! from the message, every entry's result mapped to its message's outcome.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use futures::future::join_all;
use outbox_core::{
    publisher::OutcomeCounts, Error, ErrorKind, Message, PublishOutcome, Publisher, Result,
};
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::attributes::prepare;
use crate::chunk::chunks;
use crate::config::{check_group_id, is_fifo, Routing, SqsPublisherConfig, UnkeyedGroup};
use crate::error;
use crate::request::{entry, entry_outcomes, isolating, Ready, Refused};

/// Publishes outbox messages to Amazon SQS queues.
///
/// # Contract
///
/// - **Queues.** Under [`Routing::PerDestination`] a message to destination `d` goes
///   to the queue named `<prefix>d<suffix>`; its URL is looked up with `GetQueueUrl`
///   on first use and cached (and dropped from the cache when SQS says the queue no
///   longer exists). Under [`Routing::SingleQueue`] every message goes to one queue.
///   The publisher never creates queues.
/// - **FIFO.** A queue whose name ends in `.fifo` is FIFO: each message gets
///   `MessageDeduplicationId` = its id, so SQS drops a repeat within its five-minute
///   deduplication interval (the repeat's entry succeeds and counts as
///   [`Published`](PublishOutcome::Published)), and `MessageGroupId` = its partition
///   key, so SQS keeps the order of a key's messages. A message without a key gets the
///   group of [`UnkeyedGroup`] (its own id by default: no order among unkeyed
///   messages). A key that is not a valid group id (1 to 128 ASCII letters, digits or
///   punctuation) is [`Permanent`](PublishOutcome::Permanent).
/// - **Order on FIFO queues.** SQS keeps a group's messages in the order it received
///   them. One call sends a FIFO queue's requests one after another, in the batch's
///   order; when a message of a group fails, the messages of that group in the call's
///   later requests are not sent and are [`Retryable`](PublishOutcome::Retryable), so
///   they cannot overtake it across requests. Within one request they can: if an
///   earlier entry of a group fails and a later one of the same group succeeds, the
///   later one is in the queue first. Requests are not cut to one entry per group
///   (with few keys that would mean requests of one entry). A key's order end to end
///   therefore needs the store's per-key order (`KeyOrder::PerKey`; the default is
///   unordered), under which the relay hands over one message per key at a time.
///   Under [`UnkeyedGroup::Fixed`] SQS keeps only the order in which it received the
///   unkeyed messages. A message refused before sending (size, group id) is permanent
///   and holds nothing back, as a dead letter does not. Standard queues promise no
///   order, and their requests run concurrently.
/// - **Requests.** Messages are sent with `SendMessageBatch`, at most ten per request
///   and at most [`SqsPublisherConfig::max_message_bytes`] per request in total, with
///   at most [`SqsPublisherConfig::max_concurrent_requests`] requests outstanding for
///   the publisher (across its concurrent calls). Each request is bounded by
///   [`SqsPublisherConfig::request_timeout`].
/// - **Size.** A message over [`SqsPublisherConfig::max_message_bytes`] as SQS counts
///   it (body after encoding, plus every attribute's name, type and value) is
///   [`Permanent`](PublishOutcome::Permanent) before anything is sent, with its size and
///   the limit in the reason.
/// - **Body and attributes.** See the crate docs: text payloads as is, others base64;
///   id, content type, key and trace context in message attributes; other headers as
///   attributes within SQS's ten, or as one JSON attribute.
/// - **Outcomes.** One per message, in the batch's order; `publish` itself never
///   returns `Err`. A failed entry goes by its code (a throttled entry is retryable),
///   else is permanent when SQS blames the sender (`SenderFault`) and retryable
///   otherwise; it never fails the rest of its request. A whole request that fails
///   (throttling, a timeout, the endpoint unreachable) makes its own messages
///   retryable; a queue that does not exist makes them permanent. A request of several
///   entries that SQS refuses as invalid for what it carries is sent again one entry
///   per request, so only an entry refused alone is permanent; an entry the SDK cannot
///   build is permanent alone. The mapping is the table in `error.rs`.
/// - **Cancellation.** Dropping a `publish` future abandons its requests; SQS may have
///   taken some. A later publish of the same messages is deduplicated on FIFO queues
///   within five minutes, and delivered again on standard queues (consumers
///   deduplicate on `outbox-message-id`).
///
/// Clones share the client, the queue URL cache and the request bound.
#[derive(Clone)]
pub struct SqsPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    client: aws_sdk_sqs::Client,
    config: SqsPublisherConfig,
    /// Queue name to URL, filled by `GetQueueUrl`.
    urls: Mutex<HashMap<String, String>>,
    requests: Semaphore,
}

impl fmt::Debug for SqsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cached = self.inner.urls.lock().map(|urls| urls.len()).unwrap_or(0);
        f.debug_struct("SqsPublisher")
            .field("config", &self.inner.config)
            .field("cached_queue_urls", &cached)
            .finish_non_exhaustive()
    }
}

/// One queue's share of a batch: the messages' positions, in the batch's order.
struct QueueShare {
    /// The queue name (per destination) or URL (single queue), for messages.
    name: String,
    positions: Vec<usize>,
}

impl SqsPublisher {
    /// Publish with `client` (its region, credentials, endpoint and retry settings
    /// apply).
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid config.
    pub fn new(client: aws_sdk_sqs::Client, config: SqsPublisherConfig) -> Result<Self> {
        config.validate()?;
        let requests = Semaphore::new(config.max_concurrent_requests());
        Ok(SqsPublisher {
            inner: Arc::new(Inner {
                client,
                config,
                urls: Mutex::new(HashMap::new()),
                requests,
            }),
        })
    }

    /// Publish with a client made from an SDK client config (for example one with an
    /// endpoint URL of a local SQS, a region and static credentials).
    ///
    /// ```no_run
    /// use outbox_sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    /// use outbox_sqs::{SqsPublisher, SqsPublisherConfig};
    ///
    /// let conf = outbox_sqs::aws_sdk_sqs::Config::builder()
    ///     .behavior_version(BehaviorVersion::latest())
    ///     .endpoint_url("http://127.0.0.1:4566")
    ///     .region(Region::new("us-east-1"))
    ///     .credentials_provider(Credentials::new("test", "test", None, None, "local"))
    ///     .build();
    /// let publisher = SqsPublisher::from_conf(conf, SqsPublisherConfig::new())?;
    /// # Ok::<(), outbox_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid config.
    pub fn from_conf(conf: aws_sdk_sqs::Config, config: SqsPublisherConfig) -> Result<Self> {
        Self::new(aws_sdk_sqs::Client::from_conf(conf), config)
    }

    /// The SQS client, for the rest of the application.
    pub fn client(&self) -> &aws_sdk_sqs::Client {
        &self.inner.client
    }

    /// The settings.
    pub fn config(&self) -> &SqsPublisherConfig {
        &self.inner.config
    }

    /// The URL of the queue named `name`, from the cache or `GetQueueUrl`.
    async fn queue_url(&self, name: &str) -> Result<String> {
        if let Routing::SingleQueue { url } = self.inner.config.routing() {
            return Ok(url.clone());
        }
        if let Some(url) = self.cached(name) {
            return Ok(url);
        }
        let what = format!("GetQueueUrl for queue {name:?}");
        let request = self.inner.client.get_queue_url().queue_name(name).send();
        let timeout = self.inner.config.request_timeout();
        let output = tokio::time::timeout(timeout, request)
            .await
            .map_err(|_| error::timed_out(&what, timeout))?
            .map_err(|e| error::request_error(&what, e))?;
        let url = output
            .queue_url()
            .filter(|url| !url.is_empty())
            .ok_or_else(|| Error::new(ErrorKind::Publish, format!("{what} returned no URL")))?
            .to_owned();
        self.inner
            .urls
            .lock()
            .expect("queue URL cache")
            .insert(name.to_owned(), url.clone());
        Ok(url)
    }

    fn cached(&self, name: &str) -> Option<String> {
        self.inner
            .urls
            .lock()
            .expect("queue URL cache")
            .get(name)
            .cloned()
    }

    fn forget(&self, name: &str) {
        self.inner
            .urls
            .lock()
            .expect("queue URL cache")
            .remove(name);
    }

    /// Split the batch by queue, in order of first appearance; messages whose
    /// destination names no valid queue get their outcome at once.
    fn shares(
        &self,
        batch: &[Message],
        outcomes: &mut [Option<PublishOutcome>],
    ) -> Vec<QueueShare> {
        let mut shares: Vec<QueueShare> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (position, message) in batch.iter().enumerate() {
            let name = match self.inner.config.routing() {
                Routing::SingleQueue { url } => url.clone(),
                _ => match self.inner.config.queue_name_for(&message.destination) {
                    Ok(name) => name,
                    Err(e) => {
                        outcomes[position] = Some(PublishOutcome::of_error(&e));
                        continue;
                    }
                },
            };
            let index = *by_name.entry(name.clone()).or_insert_with(|| {
                shares.push(QueueShare {
                    name,
                    positions: Vec::new(),
                });
                shares.len() - 1
            });
            shares[index].positions.push(position);
        }
        shares
    }

    /// Publish one queue's share; returns each position's outcome.
    async fn publish_share(
        &self,
        batch: &[Message],
        share: QueueShare,
    ) -> Vec<(usize, PublishOutcome)> {
        let url = match self.queue_url(&share.name).await {
            Ok(url) => url,
            Err(e) => {
                let outcome = PublishOutcome::of_error(&e);
                return share
                    .positions
                    .into_iter()
                    .map(|p| (p, outcome.clone()))
                    .collect();
            }
        };
        let fifo = is_fifo(&url);
        let single = matches!(self.inner.config.routing(), Routing::SingleQueue { .. });
        let limit = self.inner.config.max_message_bytes();
        let mut done = Vec::with_capacity(share.positions.len());
        let mut ready: Vec<Ready> = Vec::with_capacity(share.positions.len());
        for position in share.positions {
            let message = &batch[position];
            let prepared = prepare(message, single);
            if prepared.size > limit {
                let e = Error::invalid_input(format!(
                    "message {} is {} bytes as SQS counts it (body {} bytes after encoding, \
                     plus its message attributes), over the limit of {limit} bytes",
                    message.id,
                    prepared.size,
                    prepared.body.len()
                ));
                done.push((position, PublishOutcome::of_error(&e)));
                continue;
            }
            let group = if fifo {
                match self.group_of(message) {
                    Ok(group) => Some(group),
                    Err(e) => {
                        done.push((position, PublishOutcome::of_error(&e)));
                        continue;
                    }
                }
            } else {
                None
            };
            ready.push(Ready {
                position,
                id: message.id.to_string(),
                prepared,
                group,
            });
        }
        let sizes: Vec<(usize, usize)> = ready
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.prepared.size))
            .collect();
        let requests = chunks(&sizes, limit);
        if fifo {
            // One request after another, so a group's order holds across requests,
            // and a failed message holds back the rest of its group.
            let mut failed: HashSet<&str> = HashSet::new();
            for request in requests {
                let (held, send): (Vec<usize>, Vec<usize>) = request.into_iter().partition(|&i| {
                    ready[i]
                        .group
                        .as_deref()
                        .is_some_and(|g| failed.contains(g))
                });
                for i in held {
                    let group = ready[i].group.as_deref().unwrap_or_default();
                    done.push((
                        ready[i].position,
                        PublishOutcome::Retryable(format!(
                            "held back: an earlier message of group {group:?} in this batch \
                             was not published, and SQS FIFO keeps a group's order"
                        )),
                    ));
                }
                if send.is_empty() {
                    continue;
                }
                for (i, outcome) in self.send(&share.name, &url, &ready, &send).await {
                    if !matches!(outcome, PublishOutcome::Published) {
                        if let Some(group) = ready[i].group.as_deref() {
                            failed.insert(group);
                        }
                    }
                    done.push((ready[i].position, outcome));
                }
            }
        } else {
            let sent = join_all(
                requests
                    .iter()
                    .map(|request| self.send(&share.name, &url, &ready, request)),
            )
            .await;
            for (i, outcome) in sent.into_iter().flatten() {
                done.push((ready[i].position, outcome));
            }
        }
        done
    }

    /// The `MessageGroupId` of `message` on a FIFO queue.
    fn group_of(&self, message: &Message) -> Result<String> {
        match (&message.partition_key, self.inner.config.unkeyed_group()) {
            (Some(key), _) => {
                check_group_id(key).map_err(|why| {
                    Error::invalid_input(format!(
                        "the partition key {key:?} of message {} cannot be a FIFO \
                         MessageGroupId: it {why}",
                        message.id
                    ))
                })?;
                Ok(key.clone())
            }
            (None, UnkeyedGroup::Fixed(group)) => Ok(group.clone()),
            (None, _) => Ok(message.id.to_string()),
        }
    }

    /// Send `ready[i]` for `i` in `request` as one `SendMessageBatch` (or, when SQS
    /// refuses it as a whole for what it carries, each entry alone); returns each
    /// `i`'s outcome.
    async fn send(
        &self,
        name: &str,
        url: &str,
        ready: &[Ready],
        request: &[usize],
    ) -> Vec<(usize, PublishOutcome)> {
        let mut done = Vec::with_capacity(request.len());
        let mut built: Vec<(usize, SendMessageBatchRequestEntry)> =
            Vec::with_capacity(request.len());
        for &i in request {
            match entry(0, &ready[i]) {
                Ok(entry) => built.push((i, entry)),
                // The builder refused what validation let through: a bug, not the
                // broker; the rest of the request must not pay for it.
                Err(e) => done.push((i, PublishOutcome::of_error(&e))),
            }
        }
        if built.is_empty() {
            return done;
        }
        let (indices, entries): (Vec<usize>, Vec<SendMessageBatchRequestEntry>) =
            built.into_iter().unzip();
        let what = format!("SendMessageBatch to queue {name:?}");
        let sent = isolating(
            indices,
            entries,
            |i| entry(0, &ready[i]),
            |entries| self.request(name, url, &what, entries),
        )
        .await;
        done.extend(sent);
        done
    }

    /// One `SendMessageBatch` of `entries` (their ids set to their slots); each
    /// entry's outcome, or why the whole request failed.
    async fn request(
        &self,
        name: &str,
        url: &str,
        what: &str,
        mut entries: Vec<SendMessageBatchRequestEntry>,
    ) -> std::result::Result<Vec<PublishOutcome>, Refused> {
        let len = entries.len();
        for (slot, entry) in entries.iter_mut().enumerate() {
            entry.id = slot.to_string();
        }
        let timeout = self.inner.config.request_timeout();
        let result = {
            let _permit = self
                .inner
                .requests
                .acquire()
                .await
                .expect("the request semaphore is never closed");
            let call = self
                .inner
                .client
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send();
            tokio::time::timeout(timeout, call).await
        };
        match result {
            Ok(Ok(output)) => Ok(entry_outcomes(&output, len, name, what)),
            Ok(Err(e)) => {
                let code = e.code().map(str::to_owned);
                if error::is_queue_gone(code.as_deref()) {
                    // Deleted since it was looked up: look it up again next time.
                    self.forget(name);
                }
                Err(Refused {
                    error: error::request_error(what, e),
                    per_entry: error::blames_content(code.as_deref()),
                })
            }
            Err(_) => Err(Refused {
                error: error::timed_out(what, timeout),
                per_entry: false,
            }),
        }
    }
}

#[async_trait]
impl Publisher for SqsPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let span = tracing::info_span!(
            "outbox_sqs.publish",
            batch = batch.len(),
            published = tracing::field::Empty,
            retryable = tracing::field::Empty,
            permanent = tracing::field::Empty,
        );
        async move {
            let mut outcomes: Vec<Option<PublishOutcome>> = vec![None; batch.len()];
            let shares = self.shares(batch, &mut outcomes);
            let pending: Vec<_> = shares
                .into_iter()
                .map(|share| self.publish_share(batch, share))
                .collect();
            for (position, outcome) in join_all(pending).await.into_iter().flatten() {
                outcomes[position] = Some(outcome);
            }
            let outcomes: Vec<PublishOutcome> = outcomes
                .into_iter()
                .map(|o| {
                    o.unwrap_or_else(|| {
                        PublishOutcome::Retryable("the publisher lost track of the message".into())
                    })
                })
                .collect();
            OutcomeCounts::of(&outcomes).record(&tracing::Span::current());
            Ok(outcomes)
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher(config: SqsPublisherConfig) -> SqsPublisher {
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .build();
        SqsPublisher::from_conf(conf, config).unwrap()
    }

    fn keyed(key: Option<&str>) -> Message {
        Message::from(outbox_core::backend::MessageParts {
            id: outbox_core::MessageId::new(),
            destination: "d".into(),
            partition_key: key.map(str::to_owned),
            payload: Vec::new(),
            content_type: None,
            headers: outbox_core::Headers::new(),
            created_at: std::time::SystemTime::now(),
            attempts: 1,
            last_error: None,
        })
    }

    #[test]
    fn groups_are_the_key_or_the_unkeyed_rule() {
        let default = publisher(SqsPublisherConfig::new());
        assert_eq!(default.group_of(&keyed(Some("k-1"))).unwrap(), "k-1");
        let unkeyed = keyed(None);
        assert_eq!(default.group_of(&unkeyed).unwrap(), unkeyed.id.to_string());
        let fixed = publisher(
            SqsPublisherConfig::new().with_unkeyed_group(UnkeyedGroup::Fixed("all".into())),
        );
        assert_eq!(fixed.group_of(&keyed(None)).unwrap(), "all");
        assert_eq!(fixed.group_of(&keyed(Some("k"))).unwrap(), "k");
        let err = default.group_of(&keyed(Some("a b"))).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
