//! After a trimmed stream: publish again, from the table, every message item newer
//! than the trimmed shards' checkpoints, then let the relays read those shards again.

use std::time::Duration;

use outbox_core::Result;
use outbox_dynamodb::kit::{from_sdk, Item};
use tokio_util::sync::CancellationToken;

use crate::item::{self, get_n, get_s, message_id, n, parts_of, s, CREATED, FIRST_PART, PK, SK};
use crate::reader::{settle, Batch, Read};
use crate::relay::StreamRelay;
use crate::sequence::SequenceNumber;
use crate::stream;

/// How far before a trimmed shard's checkpoint a replay starts: the stream's times
/// are minute-grained, and writers' clocks drift.
pub const REPLAY_MARGIN: Duration = Duration::from_secs(120);

/// Messages a replay reads from the table before publishing them.
const REPLAY_PAGE: usize = 1000;

impl StreamRelay {
    /// Recover after [`run`](Self::run) stopped on a trimmed stream (a relay down
    /// longer than the stream's 24-hour retention):
    ///
    /// 1. reads the leases marked trimmed and takes the earliest of their checkpoint
    ///    times (the lease's creation when it had none), less [`REPLAY_MARGIN`];
    /// 2. scans the message table for messages enqueued since then (their items live
    ///    for the configured time to live, at least two days) and publishes them, with
    ///    the relay's retries and dead letters;
    /// 3. clears the mark: a shard the stream still lists is read again from its
    ///    oldest record, one it no longer lists counts as finished.
    ///
    /// Messages published before the trim are published again (consumers
    /// deduplicate); none after the checkpoint is skipped. Run it once, with every
    /// relay of the stream stopped, then start them again. The number of messages
    /// published.
    ///
    /// # Errors
    /// Mapped SDK errors; a failed publish leaves the marks in place, so the recovery
    /// can be run again.
    pub async fn recover_trimmed(&self) -> Result<u64> {
        let leases = self.lease_table().await?;
        let view = leases.read().await?;
        let trimmed: Vec<_> = view.leases.values().filter(|l| l.trimmed).collect();
        let Some(since) = trimmed
            .iter()
            .map(|l| l.checkpoint_us.unwrap_or(l.since_us))
            .min()
        else {
            return Ok(0);
        };
        let margin = u64::try_from(REPLAY_MARGIN.as_micros()).unwrap_or(u64::MAX);
        let since = since.saturating_sub(margin);
        tracing::warn!(
            shards = trimmed.len(),
            since_us = since,
            "stream relay: replaying messages from the table"
        );
        let shared = self.shared();
        let before = shared
            .counts
            .published
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut start = None;
        loop {
            let (firsts, next) = self.scan_since(since, start.take()).await?;
            let mut batch = Batch::default();
            for first in firsts {
                let Some(id) = message_id(&first) else {
                    continue;
                };
                let rest = if parts_of(&first) > 1 {
                    shared.outbox.read_parts(id).await?
                } else {
                    Vec::new()
                };
                if let Ok(message) = item::decode_message(&first, &rest) {
                    batch.messages.push(Read {
                        message,
                        seq: SequenceNumber::parse("0").expect("a number"),
                    });
                }
            }
            batch.messages.sort_by_key(|r| r.message.created_at);
            settle(shared, "replay", batch, &CancellationToken::new()).await?;
            match next {
                Some(key) => start = Some(key),
                None => break,
            }
        }
        let listed: std::collections::HashSet<String> =
            stream::list_shards(&shared.streams, leases.stream())
                .await?
                .into_iter()
                .map(|s| s.id)
                .collect();
        for lease in trimmed {
            leases
                .reset_trimmed(&lease.shard, listed.contains(&lease.shard))
                .await?;
        }
        Ok(shared
            .counts
            .published
            .load(std::sync::atomic::Ordering::Relaxed)
            - before)
    }

    /// One page of first message items enqueued at or after `since_us`.
    async fn scan_since(
        &self,
        since_us: u64,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>)> {
        let out = self
            .shared()
            .outbox
            .client()
            .scan()
            .table_name(self.shared().outbox.config().table())
            .consistent_read(true)
            .filter_expression("#sk = :first AND begins_with(#pk, :m) AND #created >= :since")
            .expression_attribute_names("#sk", SK)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#created", CREATED)
            .expression_attribute_values(":first", s(FIRST_PART))
            .expression_attribute_values(":m", s("m#"))
            .expression_attribute_values(":since", n(since_us))
            .limit(i32::try_from(REPLAY_PAGE).unwrap_or(i32::MAX))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| from_sdk("scan the message table", e))?;
        let items = out
            .items
            .unwrap_or_default()
            .into_iter()
            .filter(|i| get_s(i, SK) == Some(FIRST_PART) && get_n::<u64>(i, CREATED).is_some())
            .collect();
        Ok((items, out.last_evaluated_key.filter(|k| !k.is_empty())))
    }
}
