//! The lease table: one lease per stream shard holding its checkpoint, and one
//! heartbeat per live relay worker. Every write that depends on holding a lease is
//! conditional on its `owner` and `counter`, so a worker that lost a lease learns it
//! at its next write and writes nothing more there.
//!
//! | item | `pk` | attributes |
//! |---|---|---|
//! | shard lease | `s#<shard id>` | `stream` (ARN), `parent`, `owner`, `counter`, `expires_us`, `checkpoint` (a sequence number or `SHARD_END`), `checkpoint_us`, `since_us`, `trimmed` |
//! | worker heartbeat | `w#<worker id>` | `expires_us`, `ttl` (so TTL removes dead workers' items) |

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::ReturnConsumedCapacity;

use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::Client;
use outbox_core::Result;
use outbox_dynamodb::kit::{from_sdk, is_condition_failed, Item};

use crate::capacity::Capacity;
use crate::item::{get_n, get_s, n, now_us, s, PK};
use crate::lineage::{Position, ShardLease, Take};
use crate::sequence::SequenceNumber;

/// The lease table's time-to-live attribute (heartbeats only).
pub(crate) const LEASE_TTL: &str = "ttl";
const WORKER_PREFIX: &str = "w#";
const SHARD_PREFIX: &str = "s#";
const STREAM: &str = "stream";
const PARENT: &str = "parent";
const OWNER: &str = "owner";
const COUNTER: &str = "counter";
const EXPIRES: &str = "expires_us";
const CHECKPOINT: &str = "checkpoint";
const CHECKPOINT_AT: &str = "checkpoint_us";
const SINCE: &str = "since_us";
const TRIMMED: &str = "trimmed";
/// The checkpoint of a shard read to its end.
const SHARD_END: &str = "SHARD_END";

/// What the lease table holds for one stream, as read at one moment.
#[derive(Debug, Default)]
pub(crate) struct LeaseView {
    /// Shard id → lease, for the leases of this stream.
    pub(crate) leases: BTreeMap<String, ShardLease>,
    /// Workers whose heartbeat is unexpired.
    pub(crate) live_workers: usize,
}

/// One worker's access to the lease table of one stream.
#[derive(Debug, Clone)]
pub(crate) struct LeaseTable {
    client: Client,
    table: String,
    stream: String,
    me: String,
    lease_us: u64,
    capacity: Arc<Capacity>,
}

fn shard_key(shard: &str) -> Item {
    HashMap::from([(PK.to_owned(), s(format!("{SHARD_PREFIX}{shard}")))])
}

fn decode_lease(item: &Item) -> Option<ShardLease> {
    let shard = get_s(item, PK)?.strip_prefix(SHARD_PREFIX)?.to_owned();
    let position = match get_s(item, CHECKPOINT) {
        None => Position::TrimHorizon,
        Some(SHARD_END) => Position::End,
        Some(seq) => Position::After(SequenceNumber::parse(seq)?),
    };
    Some(ShardLease {
        shard,
        parent: get_s(item, PARENT).map(str::to_owned),
        owner: get_s(item, OWNER).map(str::to_owned),
        counter: get_n(item, COUNTER).unwrap_or(0),
        expires_us: get_n(item, EXPIRES).unwrap_or(0),
        position,
        since_us: get_n(item, SINCE).unwrap_or(0),
        checkpoint_us: get_n(item, CHECKPOINT_AT),
        trimmed: item.contains_key(TRIMMED),
    })
}

impl LeaseTable {
    pub(crate) fn new(
        client: Client,
        table: String,
        stream: String,
        me: String,
        lease: Duration,
        capacity: Arc<Capacity>,
    ) -> Self {
        LeaseTable {
            client,
            table,
            stream,
            me,
            lease_us: u64::try_from(lease.as_micros()).unwrap_or(u64::MAX),
            capacity,
        }
    }

    fn wrote(&self, consumed: Option<&aws_sdk_dynamodb::types::ConsumedCapacity>) {
        self.capacity.lease_writes.add(consumed);
    }

    /// This worker's id.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// The stream the leases belong to.
    pub(crate) fn stream(&self) -> &str {
        &self.stream
    }

    /// The leases of this stream and the live workers, read strongly consistent.
    pub(crate) async fn read(&self) -> Result<LeaseView> {
        let now = now_us();
        let mut view = LeaseView::default();
        let mut start = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| from_sdk("read the shard leases", e))?;
            self.capacity.lease_reads.add(out.consumed_capacity());
            for item in out.items() {
                let pk = get_s(item, PK).unwrap_or_default();
                if pk.starts_with(WORKER_PREFIX) {
                    if get_n::<u64>(item, EXPIRES).is_some_and(|e| e > now) {
                        view.live_workers += 1;
                    }
                } else if get_s(item, STREAM) == Some(self.stream.as_str()) {
                    match decode_lease(item) {
                        Some(lease) => {
                            view.leases.insert(lease.shard.clone(), lease);
                        }
                        None => tracing::warn!(
                            pk,
                            "stream relay: a lease item does not decode; ignored"
                        ),
                    }
                }
            }
            match out.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => return Ok(view),
            }
        }
    }

    /// Write this worker's heartbeat (`expires_us` = now + lease).
    pub(crate) async fn heartbeat(&self) -> Result<()> {
        let expires = now_us().saturating_add(self.lease_us);
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, s(format!("{WORKER_PREFIX}{}", self.me)))
            .item(EXPIRES, n(expires))
            .item(LEASE_TTL, n(expires / 1_000_000 + 3600))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| from_sdk("write the worker heartbeat", e))?;
        self.wrote(out.consumed_capacity());
        Ok(())
    }

    /// Remove this worker's heartbeat (a graceful shutdown), best effort.
    pub(crate) async fn remove_heartbeat(&self) {
        let sent = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(PK, s(format!("{WORKER_PREFIX}{}", self.me)))
            .send()
            .await;
        if let Err(e) = sent {
            tracing::debug!(error = %from_sdk("remove the heartbeat", e).report(), "stream relay");
        }
    }

    /// Create the lease of a shard found in the stream, unless it exists.
    pub(crate) async fn create(&self, shard: &str, parent: Option<&str>) -> Result<()> {
        let mut put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(shard_key(shard)))
            .item(STREAM, s(&self.stream))
            .item(COUNTER, n(0))
            .item(EXPIRES, n(0))
            .item(SINCE, n(now_us()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        if let Some(parent) = parent {
            put = put.item(PARENT, s(parent));
        }
        match put.send().await {
            Ok(out) => {
                self.wrote(out.consumed_capacity());
                Ok(())
            }
            Err(e) if is_condition_failed(&e) => Ok(()),
            Err(e) => Err(from_sdk("create a shard lease", e)),
        }
    }

    /// Delete the lease of a finished shard the stream no longer lists.
    pub(crate) async fn delete_finished(&self, shard: &str) -> Result<()> {
        let sent = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(shard)))
            .condition_expression("#cp = :end")
            .expression_attribute_names("#cp", CHECKPOINT)
            .expression_attribute_values(":end", s(SHARD_END))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failed(&e) => Ok(()),
            Err(e) => Err(from_sdk("delete a finished shard lease", e)),
        }
    }

    /// Take a lease: a free or lapsed one, or one stolen from the owner and counter
    /// `take` names. The lease as taken (its new counter, and the checkpoint as the
    /// take found it, which a stolen lease's last owner may have moved since the
    /// round read it), or `None` when another worker got there first.
    pub(crate) async fn take(&self, take: &Take) -> Result<Option<ShardLease>> {
        let now = now_us();
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(&take.shard)))
            .update_expression("SET #owner = :me, #exp = :exp ADD #counter :one")
            .expression_attribute_names("#owner", OWNER)
            .expression_attribute_names("#exp", EXPIRES)
            .expression_attribute_names("#counter", COUNTER)
            .expression_attribute_values(":me", s(&self.me))
            .expression_attribute_values(":exp", n(now.saturating_add(self.lease_us)))
            .expression_attribute_values(":one", n(1))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        update = match &take.from {
            None => update
                .condition_expression(
                    "attribute_exists(#pk) AND (attribute_not_exists(#owner) OR #exp <= :now)",
                )
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":now", n(now)),
            Some((owner, counter)) => update
                .condition_expression("#owner = :owner AND #counter = :counter")
                .expression_attribute_values(":owner", s(owner))
                .expression_attribute_values(":counter", n(counter)),
        };
        match update.send().await {
            Ok(out) => {
                self.wrote(out.consumed_capacity());
                let lease = out.attributes.as_ref().and_then(decode_lease);
                if lease.is_none() {
                    tracing::warn!(
                        shard = take.shard,
                        "stream relay: a lease taken does not decode; left alone"
                    );
                }
                Ok(lease)
            }
            Err(e) if is_condition_failed(&e) => Ok(None),
            Err(e) => Err(from_sdk("take a shard lease", e)),
        }
    }

    /// An update of a lease this worker holds at `counter`.
    fn held(&self, shard: &str, counter: u64) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(shard)))
            .condition_expression("#owner = :me AND #counter = :counter")
            .expression_attribute_names("#owner", OWNER)
            .expression_attribute_names("#counter", COUNTER)
            .expression_attribute_values(":me", s(&self.me))
            .expression_attribute_values(":counter", n(counter))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
    }

    /// Send an update of a held lease: `false` when the lease was lost.
    async fn send_held(&self, update: UpdateItemFluentBuilder, what: &str) -> Result<bool> {
        match update.send().await {
            Ok(out) => {
                self.wrote(out.consumed_capacity());
                Ok(true)
            }
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(from_sdk(what, e)),
        }
    }

    /// Push a held lease's expiry to now + lease; `false` when it was lost.
    pub(crate) async fn renew(&self, shard: &str, counter: u64) -> Result<bool> {
        let update = self
            .held(shard, counter)
            .update_expression("SET #exp = :exp")
            .expression_attribute_names("#exp", EXPIRES)
            .expression_attribute_values(":exp", n(now_us().saturating_add(self.lease_us)));
        self.send_held(update, "renew a shard lease").await
    }

    /// Record `position` (and the commit time of the record it names, when known) in a
    /// held lease, renewing it; `false` when the lease was lost. A shard's end also
    /// gives the lease up, so its children can be taken at once.
    pub(crate) async fn checkpoint(
        &self,
        shard: &str,
        counter: u64,
        position: &Position,
        at_us: Option<u64>,
    ) -> Result<bool> {
        let mut update = self
            .held(shard, counter)
            .expression_attribute_names("#cp", CHECKPOINT);
        let mut set = vec!["#cp = :cp"];
        update = match position {
            Position::TrimHorizon => return Ok(true),
            Position::After(seq) => {
                set.push("#exp = :exp");
                update
                    .expression_attribute_values(":cp", s(seq.as_str()))
                    .expression_attribute_names("#exp", EXPIRES)
                    .expression_attribute_values(":exp", n(now_us().saturating_add(self.lease_us)))
            }
            Position::End => update.expression_attribute_values(":cp", s(SHARD_END)),
        };
        if let Some(at) = at_us {
            set.push("#at = :at");
            update = update
                .expression_attribute_names("#at", CHECKPOINT_AT)
                .expression_attribute_values(":at", n(at));
        }
        let mut expression = format!("SET {}", set.join(", "));
        if *position == Position::End {
            expression.push_str(" REMOVE #owner");
        }
        self.capacity.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.send_held(update.update_expression(expression), "checkpoint a shard")
            .await
    }

    /// Give a held lease up (shutdown, or a shard this worker stops reading); `false`
    /// when it was lost already.
    pub(crate) async fn release(&self, shard: &str, counter: u64) -> Result<bool> {
        let update = self
            .held(shard, counter)
            .update_expression("REMOVE #owner SET #exp = :zero")
            .expression_attribute_names("#exp", EXPIRES)
            .expression_attribute_values(":zero", n(0));
        self.send_held(update, "release a shard lease").await
    }

    /// Mark a held lease trimmed (the stream no longer has the records after its
    /// checkpoint) and give it up: no relay reads it again until the recovery.
    pub(crate) async fn mark_trimmed(&self, shard: &str, counter: u64) -> Result<bool> {
        let update = self
            .held(shard, counter)
            .update_expression("SET #trimmed = :now, #exp = :zero REMOVE #owner")
            .expression_attribute_names("#trimmed", TRIMMED)
            .expression_attribute_names("#exp", EXPIRES)
            .expression_attribute_values(":now", n(now_us()))
            .expression_attribute_values(":zero", n(0));
        self.send_held(update, "mark a shard trimmed").await
    }

    /// After a replay: a trimmed shard still in the stream is read again from its
    /// oldest record; one gone from it is finished.
    pub(crate) async fn reset_trimmed(&self, shard: &str, listed: bool) -> Result<()> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(shard)))
            .condition_expression("attribute_exists(#trimmed)")
            .expression_attribute_names("#trimmed", TRIMMED)
            .expression_attribute_names("#cp", CHECKPOINT);
        let update = if listed {
            update.update_expression("REMOVE #trimmed, #cp")
        } else {
            update
                .update_expression("REMOVE #trimmed SET #cp = :end")
                .expression_attribute_values(":end", s(SHARD_END))
        };
        match update.send().await {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failed(&e) => Ok(()),
            Err(e) => Err(from_sdk("reset a trimmed shard", e)),
        }
    }
}
