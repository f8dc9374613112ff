//! Shard leases: relays divide the shards among themselves, like the Kinesis Client
//! Library's leases, so that in steady state each claims only from shards it owns and
//! relays do not refuse each other's writes.
//!
//! Two kinds of small items live in the outbox table, outside every index:
//!
//! | item | `pk` | `sk` | attributes |
//! |---|---|---|---|
//! | worker heartbeat | `w` | the store's random worker id | `expires_us`, `ttl` (so TTL removes dead workers' items) |
//! | shard lease | `l` | the shard, 3 digits | `owner` (a worker id), `counter` (ownership changes so far), `expires_us` |
//!
//! From its first claim on, a store keeps its leases in a background task of its own
//! (it ends when the last clone of the store is dropped or
//! [`release_shards`](DynamoOutbox::release_shards) is called), so slow publishes or a
//! full pipeline never let them lapse. Every third of the lease
//! ([`with_shard_leases`](crate::DynamoOutboxConfig::with_shard_leases)), the task reads
//! the table's shard count again (so a grown count reaches running relays) and:
//!
//! 1. writes its heartbeat (`expires_us = now + lease`);
//! 2. reads the live workers (`pk = w`, strongly consistent, unexpired) and the leases
//!    (`pk = l`, strongly consistent): the target is ⌈table's shards ÷ live workers⌉;
//! 3. renews its own leases, all at once, each conditional on `owner = me AND counter = c`: a lease
//!    another worker took is dropped at once;
//! 4. below target, takes free and lapsed leases (`attribute_not_exists(pk) OR
//!    expires_us <= now`, adding one to `counter`), then steals from the worker holding
//!    the most leases while that one holds more than the target (conditional on its
//!    `owner` and `counter`, so of two stealers one wins).
//!
//! A stolen lease's old owner learns it at its next renewal; until then both may claim
//! from the shard, which costs at most refused writes (the conditional write on the
//! message is still the claim). A dead worker's leases lapse after the lease and are
//! taken by the others; its heartbeat lapses with them, so the target follows.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity, ReturnValue};
use outbox_core::Result;

use crate::concurrency::bounded_all;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{self, get_n, get_s, n, now_us, s, Item, PK, SK, TTL};
use crate::store::DynamoOutbox;

const WORKERS_PK: &str = "w";
const LEASES_PK: &str = "l";
const OWNER: &str = "owner";
const COUNTER: &str = "counter";
const EXPIRES: &str = "expires_us";

/// One shard lease as read from the table.
#[derive(Debug, Clone)]
struct LeaseRow {
    shard: u16,
    owner: Option<String>,
    counter: u64,
    expires_us: u64,
}

/// What a store knows of its own shard leases: shard → (counter, expires_us).
type Held = BTreeMap<u16, (u64, u64)>;

/// The shard-lease side of a [`DynamoOutbox`]: its worker id and held leases.
#[derive(Debug)]
pub(crate) struct ShardLeases {
    owner: String,
    lease_us: u64,
    renew_us: u64,
    held: std::sync::Mutex<Held>,
    /// One maintenance round (or release) at a time.
    maintaining: tokio::sync::Mutex<()>,
    /// Whether the first round ran and the upkeep task was started.
    started: AtomicBool,
    /// Set by a release: no more rounds, no more claims from leases.
    stopped: AtomicBool,
}

impl ShardLeases {
    pub(crate) fn new(lease: Duration) -> Self {
        let lease_us = item::duration_us(lease);
        ShardLeases {
            owner: uuid::Uuid::new_v4().simple().to_string(),
            lease_us,
            renew_us: lease_us / 3,
            held: std::sync::Mutex::new(Held::new()),
            maintaining: tokio::sync::Mutex::new(()),
            started: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shards held with an unexpired lease by this process's clock.
    fn live(&self, now: u64) -> Vec<u16> {
        self.held()
            .iter()
            .filter(|(_, (_, expires))| *expires > now)
            .map(|(shard, _)| *shard)
            .collect()
    }
}

fn lease_key(shard: u16) -> Item {
    HashMap::from([
        (PK.to_owned(), s(LEASES_PK)),
        (SK.to_owned(), s(format!("{shard:03}"))),
    ])
}

impl DynamoOutbox {
    /// The shards this store's claims read: every shard of the table without shard
    /// leases; with them, the shards it holds. The first call runs one maintenance round
    /// itself and starts the upkeep task.
    ///
    /// # Errors
    /// Reading the table's shard count failed, or this store is configured with more
    /// shards than the table (see [`check_shards`](Self::check_shards)).
    pub(crate) async fn claim_shards(&self) -> Result<Vec<u16>> {
        let Some(leases) = &self.inner.leases else {
            return Ok((0..self.table_shards().await?.shards).collect());
        };
        if !leases.started.load(Ordering::Acquire) {
            let _guard = leases.maintaining.lock().await;
            if !leases.started.load(Ordering::Acquire) && !leases.stopped.load(Ordering::Acquire) {
                let table = self.refresh_shards().await?;
                if let Err(e) = self.maintain_leases(leases, table.shards).await {
                    tracing::warn!(error = %e.report(), "shard lease maintenance failed; the upkeep task tries again");
                }
                self.start_upkeep();
                leases.started.store(true, Ordering::Release);
            }
        }
        Ok(leases.live(now_us()))
    }

    /// Keep this store's leases in a task of its own: a round every third of the lease
    /// (a quarter of that after a failed round), never waiting on claims or publishes.
    /// The task holds the store only during a round, so it ends once every clone of
    /// the store is dropped, or at the first round after a release.
    fn start_upkeep(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                let pause = {
                    let Some(inner) = store.upgrade() else {
                        return;
                    };
                    let store = DynamoOutbox { inner };
                    match store.upkeep_round().await {
                        Some(pause) => pause,
                        None => return,
                    }
                };
                tokio::time::sleep(pause).await;
            }
        });
    }

    /// One round of the upkeep task: how long until the next, `None` to stop.
    async fn upkeep_round(&self) -> Option<Duration> {
        let leases = self.inner.leases.as_ref()?;
        let _guard = leases.maintaining.lock().await;
        if leases.stopped.load(Ordering::Acquire) {
            return None;
        }
        let round = async {
            let table = self.refresh_shards().await?;
            self.maintain_leases(leases, table.shards).await
        };
        let pause_us = match round.await {
            Ok(()) => leases.renew_us,
            Err(e) => {
                tracing::warn!(error = %e.report(), "shard lease maintenance failed; claiming from the shards still held");
                leases.renew_us / 4
            }
        };
        Some(Duration::from_micros(pause_us))
    }

    /// The shards this store holds leases on now (empty without shard leases).
    pub async fn owned_shards(&self) -> Vec<u16> {
        match &self.inner.leases {
            Some(leases) => leases.live(now_us()),
            None => Vec::new(),
        }
    }

    /// Give up this store's shard leases and heartbeat at once (a relay shutting down),
    /// so the other workers take its shards at their next maintenance instead of after
    /// the lease lapses. Without shard leases, nothing is sent.
    ///
    /// # Errors
    /// Mapped SDK errors; leases not released lapse on their own.
    pub async fn release_shards(&self) -> Result<()> {
        let Some(leases) = &self.inner.leases else {
            return Ok(());
        };
        let _guard = leases.maintaining.lock().await;
        leases.stopped.store(true, Ordering::Release);
        let owned: Vec<(u16, u64)> = {
            std::mem::take(&mut *leases.held())
                .into_iter()
                .map(|(shard, (counter, _))| (shard, counter))
                .collect()
        };
        for (shard, counter) in owned {
            let sent = self
                .inner
                .client
                .update_item()
                .table_name(self.table())
                .set_key(Some(lease_key(shard)))
                .update_expression("SET #e = :zero")
                .condition_expression("#o = :me AND #c = :c")
                .expression_attribute_names("#o", OWNER)
                .expression_attribute_names("#c", COUNTER)
                .expression_attribute_names("#e", EXPIRES)
                .expression_attribute_values(":me", s(&leases.owner))
                .expression_attribute_values(":c", n(counter))
                .expression_attribute_values(":zero", n(0))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            match sent {
                Ok(out) => self.record_upkeep(out.consumed_capacity()),
                Err(e) if is_condition_failed(&e) => {}
                Err(e) => return Err(from_sdk("release shard lease", e)),
            }
        }
        self.inner
            .client
            .delete_item()
            .table_name(self.table())
            .key(PK, s(WORKERS_PK))
            .key(SK, s(&leases.owner))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map(|out| self.record_upkeep(out.consumed_capacity()))
            .map_err(|e| from_sdk("release shard leases", e))?;
        Ok(())
    }

    /// One maintenance round over a table of `shards` shards (steps 1-4 of the module
    /// docs).
    async fn maintain_leases(&self, leases: &ShardLeases, shards: u16) -> Result<()> {
        let now = now_us();
        let expires = now + leases.lease_us;
        // 1. Heartbeat.
        self.inner
            .client
            .put_item()
            .table_name(self.table())
            .item(PK, s(WORKERS_PK))
            .item(SK, s(&leases.owner))
            .item(EXPIRES, n(expires))
            .item(TTL, n(expires.div_ceil(1_000_000) + 3600))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map(|out| self.record_upkeep(out.consumed_capacity()))
            .map_err(|e| from_sdk("shard lease heartbeat", e))?;
        // 2. Live workers and the leases.
        let workers = self
            .query_partition(WORKERS_PK)
            .await?
            .iter()
            .filter(|w| get_n::<u64>(w, EXPIRES).ok().flatten().unwrap_or(0) > now)
            .count()
            .max(1);
        let mut rows: HashMap<u16, LeaseRow> = HashMap::new();
        for item in self.query_partition(LEASES_PK).await? {
            let Some(shard) = get_s(&item, SK).and_then(|t| t.parse::<u16>().ok()) else {
                continue;
            };
            rows.insert(
                shard,
                LeaseRow {
                    shard,
                    owner: get_s(&item, OWNER).map(str::to_owned),
                    counter: get_n(&item, COUNTER)?.unwrap_or(0),
                    expires_us: get_n(&item, EXPIRES)?.unwrap_or(0),
                },
            );
        }
        let target = usize::from(shards).div_ceil(workers);
        // 3. Renew what is still ours, all at once.
        let mine: Vec<&LeaseRow> = rows
            .values()
            .filter(|row| {
                row.owner.as_deref() == Some(leases.owner.as_str()) && row.expires_us > now
            })
            .collect();
        let renewed = bounded_all(
            mine.iter()
                .map(|row| self.renew_lease(leases, row, expires))
                .collect(),
        )
        .await;
        let mut owned: Held = BTreeMap::new();
        let mut failed = None;
        for (row, renewed) in mine.into_iter().zip(renewed) {
            match renewed {
                Ok(true) => {
                    owned.insert(row.shard, (row.counter, expires));
                }
                Ok(false) => {}
                // Still ours until it lapses: keep claiming from it meanwhile.
                Err(e) => {
                    owned.insert(row.shard, (row.counter, row.expires_us));
                    failed.get_or_insert(e);
                }
            }
        }
        // 4. Take free and lapsed leases, then steal from the most loaded worker.
        let mut free: Vec<u16> = (0..shards)
            .filter(|shard| {
                rows.get(shard)
                    .is_none_or(|r| r.owner.is_none() || r.expires_us <= now)
            })
            .collect();
        fastrand::shuffle(&mut free);
        for shard in free {
            if owned.len() >= target {
                break;
            }
            if let Some(counter) = self.take_lease(leases, shard, None, now, expires).await? {
                owned.insert(shard, (counter, expires));
            }
        }
        let mut load: HashMap<&str, Vec<&LeaseRow>> = HashMap::new();
        for row in rows.values() {
            if let Some(owner) = row.owner.as_deref() {
                if owner != leases.owner && row.expires_us > now {
                    load.entry(owner).or_default().push(row);
                }
            }
        }
        while owned.len() < target {
            let Some((_, victim)) = load
                .iter_mut()
                .filter(|(_, rows)| rows.len() > target)
                .max_by_key(|(_, rows)| rows.len())
            else {
                break;
            };
            let Some(row) = victim.pop() else {
                break;
            };
            if let Some(counter) = self
                .take_lease(leases, row.shard, Some(row), now, expires)
                .await?
            {
                owned.insert(row.shard, (counter, expires));
            }
        }
        *leases.held() = owned;
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Count `capacity` as upkeep.
    pub(crate) fn record_upkeep(&self, capacity: Option<&ConsumedCapacity>) {
        self.record_capacity(&self.inner.metrics.upkeep_units, capacity);
    }

    /// Every item of partition `pk` (strongly consistent).
    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>> {
        let query = self
            .inner
            .client
            .query()
            .table_name(self.table())
            .consistent_read(true)
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_values(":pk", s(pk))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        self.query_all(
            query,
            "read shard leases",
            Some(&self.inner.metrics.upkeep_units),
        )
        .await
    }

    async fn renew_lease(
        &self,
        leases: &ShardLeases,
        row: &LeaseRow,
        expires: u64,
    ) -> Result<bool> {
        let sent = self
            .inner
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(lease_key(row.shard)))
            .update_expression("SET #e = :e")
            .condition_expression("#o = :me AND #c = :c")
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#c", COUNTER)
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_values(":me", s(&leases.owner))
            .expression_attribute_values(":c", n(row.counter))
            .expression_attribute_values(":e", n(expires))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.record_upkeep(out.consumed_capacity());
                Ok(true)
            }
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(from_sdk("renew shard lease", e)),
        }
    }

    /// Take the lease of `shard`: free or lapsed (`from` = `None`), or stolen from the
    /// holder `from` was read with. The new counter, or `None` when someone else won.
    async fn take_lease(
        &self,
        leases: &ShardLeases,
        shard: u16,
        from: Option<&LeaseRow>,
        now: u64,
        expires: u64,
    ) -> Result<Option<u64>> {
        let mut request = self
            .inner
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(lease_key(shard)))
            .update_expression("SET #o = :me, #e = :e ADD #c :one")
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#c", COUNTER)
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_values(":me", s(&leases.owner))
            .expression_attribute_values(":e", n(expires))
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::UpdatedNew)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        request = match from {
            None => request
                .condition_expression("attribute_not_exists(#pk) OR #e <= :now")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":now", n(now)),
            Some(row) => request
                .condition_expression("#o = :them AND #c = :c")
                .expression_attribute_values(":them", s(row.owner.clone().unwrap_or_default()))
                .expression_attribute_values(":c", n(row.counter)),
        };
        match request.send().await {
            Ok(out) => Ok(Some({
                self.record_upkeep(out.consumed_capacity());
                out.attributes()
                    .map(|a| get_n::<u64>(a, COUNTER))
                    .transpose()?
                    .flatten()
                    .unwrap_or(0)
            })),
            Err(e) if is_condition_failed(&e) => Ok(None),
            Err(e) => Err(from_sdk("take shard lease", e)),
        }
    }
}
