//! [`DynamoDistributedLock`]: a [`DistributedLock`] made of one lease item per lock name
//! in a DynamoDB table, with a fencing token.
//!
//! The protocol is documented on [`DynamoDistributedLock`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;
use aws_sdk_dynamodb::Client;
use outbox_core::{lock::LockGuard, DistributedLock, Error, ErrorKind, LockName, Result};
use tokio::task::JoinHandle;

use crate::config::DynamoLockConfig;
use crate::error::{from_sdk, is_condition_failed};
use crate::item::{duration_us, get_n, n, now_us, s, PK};

/// The number of acquisitions of a name so far: the fencing token of the latest.
pub(crate) const FENCE: &str = "fence";
/// A random id of the guard holding the lease; removed on release.
pub(crate) const OWNER: &str = "owner";
/// When the lease lapses, in microseconds since the epoch; 0 once released.
pub(crate) const EXPIRES: &str = "expires_us";

/// Named leases in a DynamoDB table: a [`DistributedLock`] for singleton work across a
/// fleet (purges, migrations).
///
/// # Item
///
/// | `pk` | `fence` | `owner` | `expires_us` |
/// |---|---|---|---|
/// | the lock name, byte for byte | acquisitions so far (number) | a random id of the current guard, absent once released | when the lease lapses, microseconds since the epoch by the writer's clock; 0 once released |
///
/// Items are never deleted: the item keeps the fencing counter, so a later holder always
/// gets a larger token. One item per name ever used (about 100 bytes) is the cost.
///
/// # Protocol
///
/// 1. **Acquire**: one `UpdateItem` with the condition
///    `attribute_not_exists(pk) OR expires_us <= :now` sets `owner` to a fresh random id,
///    `expires_us = now + lease`, adds one to `fence` and returns the new `fence`, the
///    guard's fencing token. DynamoDB applies conditional writes to one item one at a
///    time, so of concurrent acquisitions exactly one passes; the others fail the
///    condition and `try_lock` returns `Ok(None)` at once, without waiting.
/// 2. **Renew**: while the guard lives, a background task writes
///    `expires_us = now + lease` every [`renew_every`](crate::DynamoLockConfig::renew_every),
///    conditional on `owner = :mine AND fence = :mine AND expires_us > :now`. A lapsed
///    lease is never revived: once the condition fails, or the lease lapses while
///    renewals fail to reach DynamoDB, the guard is lost
///    ([`DynamoLockGuard::is_lost`]) and renewals stop.
/// 3. **Release** ([`LockGuard::unlock`]): the renewal task is stopped, then one
///    `UpdateItem` sets `expires_us = 0` and removes `owner`, conditional on
///    `owner = :mine AND fence = :mine`, so a guard whose lease lapsed can never release
///    the next holder's lock. The next acquisition passes at once.
/// 4. **Drop without unlock**: the renewal task is stopped and, inside a Tokio runtime,
///    the release of step 3 is sent from a spawned task, so the lock is free within a
///    round trip; outside a runtime, or if that write fails, the lease lapses within
///    [`lease`](crate::DynamoLockConfig::lease). A crashed process's lock lapses the same way.
///
/// # Fencing
///
/// [`DynamoLockGuard::fencing_token`] grows with every acquisition of a name. A lease
/// lock cannot stop a paused holder (a long GC pause, a frozen VM) from acting after its
/// lease lapsed; pass the token to the resources the singleton work writes and have
/// them refuse tokens lower than one already seen.
///
/// ## Limitations
///
/// - **Clocks.** Leases are measured by the clocks of the processes involved (DynamoDB
///   has no clock to offer): skew between the holder and the next acquirer shortens or
///   lengthens the lease by the skew. Keep clocks synchronised and the lease well above
///   the worst skew.
/// - **Global Tables.** A conditional write is atomic only within the region that takes
///   it; Global Tables replicate asynchronously and settle conflicts by last writer
///   wins, so two regions could each grant the lock. [`DynamoDistributedLock::install`]
///   refuses a table whose description lists replicas
///   ([`ErrorKind::Config`](outbox_core::ErrorKind::Config)); a table made global after
///   the install is not detected. Use a table of one region.
/// - **Lost locks are reported, not prevented.** A holder that cannot renew (a network
///   partition, throttling) loses the lock when its lease lapses; the work it was doing
///   learns of it only through [`DynamoLockGuard::is_lost`], an unlock error, or fencing.
/// - A renewal costs one write unit per [`renew_every`](crate::DynamoLockConfig::renew_every)
///   per held lock.
///
/// # Example
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client) -> outbox_core::Result<()> {
/// use outbox_core::LockName;
/// use outbox_dynamodb::{DynamoDistributedLock, DynamoLockConfig};
///
/// let locks = DynamoDistributedLock::new(client, DynamoLockConfig::default())?;
/// locks.install().await?;
/// if let Some(guard) = locks.acquire(&LockName::new("purge")?).await? {
///     let token = guard.fencing_token(); // hand it to what the work writes
///     // ... singleton work ...
///     # let _ = token;
///     outbox_core::lock::LockGuard::unlock(Box::new(guard)).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoDistributedLock {
    client: Client,
    config: DynamoLockConfig,
}

impl DynamoDistributedLock {
    /// A lock space over `client` with `config`. Sends nothing.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(client: Client, config: DynamoLockConfig) -> Result<Self> {
        config.validate()?;
        Ok(DynamoDistributedLock { client, config })
    }

    /// The settings.
    pub fn config(&self) -> &DynamoLockConfig {
        &self.config
    }

    /// Create the table if missing (on-demand billing, key `pk`) and wait until it is
    /// active; an existing table is checked.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists with
    /// another key; [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when it is a
    /// Global Table (it lists replicas); mapped SDK errors otherwise.
    pub async fn install(&self) -> Result<()> {
        crate::schema::install(
            &self.client,
            &crate::schema::lock_table(self.config.table()),
        )
        .await?;
        crate::schema::refuse_replicas(&self.client, self.config.table(), "lock").await
    }

    /// Take the lock `name` if nobody holds it (or its holder's lease lapsed): the
    /// concrete guard, with its [fencing token](DynamoLockGuard::fencing_token).
    /// [`DistributedLock::try_lock`] is this, boxed. Must be called inside a Tokio
    /// runtime (the guard's renewals run on it).
    ///
    /// # Errors
    /// Mapped SDK errors (a missing table is
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema)).
    pub async fn acquire(&self, name: &LockName) -> Result<Option<DynamoLockGuard>> {
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let now = now_us();
        let lease_us = duration_us(self.config.lease());
        let expires = now.saturating_add(lease_us);
        let sent = self
            .client
            .update_item()
            .table_name(self.config.table())
            .key(PK, s(name.as_str()))
            .update_expression("SET #o = :o, #e = :e ADD #f :one")
            .condition_expression("attribute_not_exists(#pk) OR #e <= :now")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_names("#f", FENCE)
            .expression_attribute_values(":o", s(owner.clone()))
            .expression_attribute_values(":e", n(expires))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(now))
            .return_values(ReturnValue::UpdatedNew)
            .send()
            .await;
        let out = match sent {
            Ok(out) => out,
            Err(e) if is_condition_failed(&e) => return Ok(None),
            Err(e) => return Err(from_sdk("lock", e)),
        };
        let fence = out
            .attributes()
            .map(|a| get_n::<u64>(a, FENCE))
            .transpose()?
            .flatten()
            .ok_or_else(|| Error::new(ErrorKind::Storage, "lock: no fencing token returned"))?;
        let lease = Arc::new(Lease {
            client: self.client.clone(),
            table: self.config.table().to_owned(),
            name: name.clone(),
            owner,
            fence,
            lease_us,
            expires_us: AtomicU64::new(expires),
            lost: AtomicBool::new(false),
        });
        let renewal = tokio::spawn(renew_loop(lease.clone(), self.config.renew_every()));
        Ok(Some(DynamoLockGuard {
            lease,
            renewal,
            released: false,
        }))
    }
}

#[async_trait]
impl DistributedLock for DynamoDistributedLock {
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>> {
        Ok(self
            .acquire(name)
            .await?
            .map(|g| Box::new(g) as Box<dyn LockGuard>))
    }
}

/// What a guard and its renewal task share.
#[derive(Debug)]
struct Lease {
    client: Client,
    table: String,
    name: LockName,
    owner: String,
    fence: u64,
    lease_us: u64,
    /// The lease expiry as last written by this guard.
    expires_us: AtomicU64,
    /// A renewal was refused, or the lease lapsed while renewals failed.
    lost: AtomicBool,
}

impl Lease {
    /// Extend the lease; `Ok(false)` when it is no longer this guard's (lapsed or taken).
    async fn renew(&self) -> Result<bool> {
        let now = now_us();
        let expires = now.saturating_add(self.lease_us);
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, s(self.name.as_str()))
            .update_expression("SET #e = :e")
            .condition_expression("#o = :o AND #f = :f AND #e > :now")
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_names("#f", FENCE)
            .expression_attribute_values(":o", s(self.owner.clone()))
            .expression_attribute_values(":f", n(self.fence))
            .expression_attribute_values(":e", n(expires))
            .expression_attribute_values(":now", n(now))
            .send()
            .await;
        match sent {
            Ok(_) => {
                self.expires_us.store(expires, Ordering::Release);
                Ok(true)
            }
            Err(e) if is_condition_failed(&e) => Ok(false),
            Err(e) => Err(from_sdk("renew lock", e)),
        }
    }

    /// Give the lease up; a refused condition means it was no longer ours.
    async fn release(&self) -> Result<()> {
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, s(self.name.as_str()))
            .update_expression("SET #e = :zero REMOVE #o")
            .condition_expression("#o = :o AND #f = :f")
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#e", EXPIRES)
            .expression_attribute_names("#f", FENCE)
            .expression_attribute_values(":o", s(self.owner.clone()))
            .expression_attribute_values(":f", n(self.fence))
            .expression_attribute_values(":zero", n(0))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failed(&e) => {
                self.lost.store(true, Ordering::Release);
                Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "unlock of {:?}: the lease with fencing token {} had lapsed before the \
                         unlock; another holder may have taken the lock meanwhile",
                        self.name, self.fence
                    ),
                ))
            }
            Err(e) => Err(from_sdk("unlock", e)),
        }
    }
}

/// Renew every `every` until the lease is lost (or the task is aborted by unlock/drop).
async fn renew_loop(lease: Arc<Lease>, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the lease is fresh
    loop {
        tick.tick().await;
        match lease.renew().await {
            Ok(true) => {}
            Ok(false) => {
                lease.lost.store(true, Ordering::Release);
                tracing::warn!(lock = %lease.name, fence = lease.fence, "lock lease lost: a renewal was refused");
                return;
            }
            Err(e) if now_us() >= lease.expires_us.load(Ordering::Acquire) => {
                lease.lost.store(true, Ordering::Release);
                tracing::warn!(lock = %lease.name, fence = lease.fence, error = %e.report(), "lock lease lapsed while renewals failed");
                return;
            }
            Err(e) => {
                tracing::debug!(lock = %lease.name, error = %e.report(), "lock renewal failed; retrying before the lease lapses");
            }
        }
    }
}

/// A held [`DynamoDistributedLock`] lock; renews its lease in the background until
/// unlocked or dropped (a drop inside a Tokio runtime releases at once, see the
/// [`DynamoDistributedLock`] protocol).
#[derive(Debug)]
pub struct DynamoLockGuard {
    lease: Arc<Lease>,
    renewal: JoinHandle<()>,
    released: bool,
}

impl DynamoLockGuard {
    /// This acquisition's fencing token: larger than that of every earlier acquisition
    /// of the same name in the same table.
    pub fn fencing_token(&self) -> u64 {
        self.lease.fence
    }

    /// Whether this guard no longer holds the lock: a renewal was refused (the lease
    /// had lapsed, or someone took it), or the lease's expiry passed by this process's
    /// clock. `false` means held as far as this process can tell.
    pub fn is_lost(&self) -> bool {
        self.lease.lost.load(Ordering::Acquire)
            || now_us() >= self.lease.expires_us.load(Ordering::Acquire)
    }
}

#[async_trait]
impl LockGuard for DynamoLockGuard {
    fn name(&self) -> &LockName {
        &self.lease.name
    }

    /// Stop renewing and release the lease at once.
    ///
    /// # Errors
    /// [`ErrorKind::Conflict`] when the lease had already lapsed (the lock may have had
    /// another holder meanwhile); mapped SDK errors when the release could not be sent,
    /// in which case the lease lapses within the configured lease.
    async fn unlock(mut self: Box<Self>) -> Result<()> {
        self.released = true;
        self.renewal.abort();
        self.lease.release().await
    }
}

impl Drop for DynamoLockGuard {
    fn drop(&mut self) {
        self.renewal.abort();
        if self.released {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let lease = self.lease.clone();
            runtime.spawn(async move {
                if let Err(e) = lease.release().await {
                    tracing::debug!(lock = %lease.name, error = %e.report(), "release of a dropped lock guard failed; its lease will lapse");
                }
            });
        }
    }
}
