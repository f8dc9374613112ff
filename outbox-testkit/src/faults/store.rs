//! A store wrapper that injects faults into the relay path: [`FaultyStore`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Failure, store::Lease,
    store::Renewed, store::Settled, store::StoreCapabilities, Error, ErrorKind, ErrorStatus,
    MessageId, OutboxStore, Result,
};

/// A store operation faults can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`OutboxStore::claim`].
    Claim,
    /// [`OutboxStore::claim_ids`].
    ClaimIds,
    /// [`OutboxStore::complete`].
    Complete,
    /// [`OutboxStore::fail`].
    Fail,
    /// [`OutboxStore::release`].
    Release,
    /// [`OutboxStore::renew`].
    Renew,
}

/// What an injected fault does to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without touching the store, with an [`ErrorKind::Unavailable`] error of
    /// this status.
    Error(ErrorStatus),
    /// Apply the call to the store, then fail with a retryable error, as a connection
    /// that drops after the commit would: a retry then finds the leases already spent.
    ErrorAfterApplying,
    /// Panic instead of answering.
    Panic,
}

#[derive(Debug, Default)]
struct Plan {
    /// Per operation: faults in order, each with how many calls it still applies to.
    faults: HashMap<Op, VecDeque<(Fault, usize)>>,
    calls: HashMap<Op, usize>,
    claim_delay: Duration,
    /// The ids each renew call asked for, call by call.
    renewals: Vec<Vec<MessageId>>,
}

/// Wraps an [`OutboxStore`] and makes chosen calls fail, panic or stall, to test how a
/// relay copes: settles retried with backoff, claims failing, panics caught.
///
/// Faults are queued per operation and used up one per call, in order; calls with no
/// fault queued pass through. Clones share the plan.
///
/// ```
/// use std::sync::Arc;
/// use outbox_core::ErrorStatus;
/// use outbox_testkit::{Fault, FaultyStore, MemoryStore, Op};
///
/// let store = FaultyStore::new(Arc::new(MemoryStore::new()));
/// // The next two completes fail as a dropped connection would.
/// store.inject(Op::Complete, Fault::Error(ErrorStatus::Temporary), 2);
/// assert_eq!(store.calls(Op::Complete), 0);
/// ```
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn OutboxStore>,
    plan: Arc<Mutex<Plan>>,
}

impl FaultyStore {
    /// Wrap `inner`, with no faults planned.
    pub fn new(inner: Arc<dyn OutboxStore>) -> Self {
        FaultyStore {
            inner,
            plan: Arc::default(),
        }
    }

    /// Make the next `times` calls of `op` (after those already planned) meet `fault`.
    pub fn inject(&self, op: Op, fault: Fault, times: usize) {
        let mut plan = self.plan();
        if times > 0 {
            plan.faults.entry(op).or_default().push_back((fault, times));
        }
    }

    /// Make every claim (and claim of ids) take `delay` longer, before it reaches the
    /// store: the leases it returns are then that much closer to lapsing.
    pub fn delay_claims(&self, delay: Duration) {
        self.plan().claim_delay = delay;
    }

    /// How many calls of `op` were made, faulty or not (a delayed claim counts from
    /// the moment it is made).
    pub fn calls(&self, op: Op) -> usize {
        self.plan().calls.get(&op).copied().unwrap_or(0)
    }

    /// The ids each [`OutboxStore::renew`] call asked to extend, call by call (faulty
    /// calls included): what a relay thought it still held when it renewed.
    pub fn renewals(&self) -> Vec<Vec<MessageId>> {
        self.plan().renewals.clone()
    }

    /// Faults planned for `op` and not yet used.
    pub fn pending_faults(&self, op: Op) -> usize {
        let plan = self.plan();
        let queue = plan.faults.get(&op);
        queue.map_or(0, |q| q.iter().map(|(_, n)| *n).sum())
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count the call and take its fault, if one is planned.
    fn next_fault(&self, op: Op) -> Option<Fault> {
        let mut plan = self.plan();
        *plan.calls.entry(op).or_default() += 1;
        let queue = plan.faults.get_mut(&op)?;
        let (fault, left) = queue.front_mut()?;
        let fault = *fault;
        *left -= 1;
        if *left == 0 {
            queue.pop_front();
        }
        Some(fault)
    }

    async fn run<T, F>(&self, op: Op, call: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let fault = self.next_fault(op);
        Self::apply(op, fault, call).await
    }

    /// A claim: counted (and its fault taken) when it is made, then delayed.
    async fn run_claim<T, F>(&self, op: Op, call: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let fault = self.next_fault(op);
        let delay = self.plan().claim_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Self::apply(op, fault, call).await
    }

    async fn apply<T, F>(op: Op, fault: Option<Fault>, call: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        match fault {
            None => call.await,
            Some(Fault::Error(status)) => Err(injected(op, status)),
            Some(Fault::ErrorAfterApplying) => {
                call.await?;
                Err(injected(op, ErrorStatus::Temporary))
            }
            Some(Fault::Panic) => panic!("injected panic in {op:?}"),
        }
    }
}

fn injected(op: Op, status: ErrorStatus) -> Error {
    Error::new(ErrorKind::Unavailable, format!("injected {op:?} fault")).with_status(status)
}

#[async_trait]
impl OutboxStore for FaultyStore {
    fn capabilities(&self) -> StoreCapabilities {
        self.inner.capabilities()
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        self.run_claim(Op::Claim, self.inner.claim(request)).await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        self.run_claim(Op::ClaimIds, self.inner.claim_ids(request))
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        self.run(Op::Complete, self.inner.complete(leases)).await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        self.run(Op::Fail, self.inner.fail(failures)).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.run(Op::Release, self.inner.release(leases)).await
    }

    // `settle_and_claim` keeps the default, so its parts go through the faults of
    // complete, fail, release and claim above.

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        let ids = leases.iter().map(|l| l.id).collect();
        self.plan().renewals.push(ids);
        self.run(Op::Renew, self.inner.renew(leases, lease)).await
    }
}
