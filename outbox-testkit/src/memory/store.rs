//! An in-memory reference implementation of the whole store contract.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use outbox_core::admin::MAX_ADMIN_BATCH;
use outbox_core::backend::MessageParts;
use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::ClaimedMessage,
    store::Disposition, store::Failure, store::Lease, store::LeaseToken, store::Renewed,
    store::Settled, store::StoreCapabilities, DeadLetter, DeadLetterFilter, DeadLetterOrder,
    DeadLetterPage, DeadLetterSelection, Error, ErrorKind, KeyOrder, Message, MessageId,
    MessageLimits, NewMessage, OutboxAdmin, OutboxStats, OutboxStore, Result, Retention,
};

#[derive(Debug)]
struct Row {
    message: Message,
    seq: u64,
    available_at: SystemTime,
    token: Option<LeaseToken>,
    dispatched_at: Option<SystemTime>,
    dead_at: Option<SystemTime>,
}

impl Row {
    fn is_pending(&self) -> bool {
        self.dispatched_at.is_none() && self.dead_at.is_none()
    }
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    rows: HashMap<MessageId, Row>,
    /// Pending rows by availability then enqueue order: the partial "due" index.
    due: BTreeSet<(SystemTime, u64, MessageId)>,
    /// Enqueue positions of pending rows per partition key.
    key_pending: HashMap<String, BTreeSet<u64>>,
    /// Rows locked by another "transaction" (see [`MemoryStore::lock_row`]).
    locked: HashSet<MessageId>,
}

impl State {
    fn insert(&mut self, msg: &NewMessage, now: SystemTime, available_at: SystemTime) {
        self.next_seq += 1;
        let message = Message::from(MessageParts {
            id: msg.id(),
            destination: msg.destination().to_owned(),
            partition_key: msg.partition_key().map(str::to_owned),
            payload: msg.payload().to_vec(),
            content_type: msg.content_type().map(str::to_owned),
            headers: msg.headers().clone(),
            created_at: now,
            attempts: 0,
            last_error: None,
        });
        let row = Row {
            message,
            seq: self.next_seq,
            available_at,
            token: None,
            dispatched_at: None,
            dead_at: None,
        };
        self.index(&row);
        self.rows.insert(msg.id(), row);
    }

    fn index(&mut self, row: &Row) {
        self.due.insert((row.available_at, row.seq, row.message.id));
        if let Some(key) = &row.message.partition_key {
            self.key_pending
                .entry(key.clone())
                .or_default()
                .insert(row.seq);
        }
    }

    fn unindex(&mut self, id: MessageId) {
        let Some(row) = self.rows.get(&id) else {
            return;
        };
        self.due.remove(&(row.available_at, row.seq, id));
        if let Some(key) = &row.message.partition_key {
            if let Some(seqs) = self.key_pending.get_mut(key) {
                seqs.remove(&row.seq);
                if seqs.is_empty() {
                    self.key_pending.remove(key);
                }
            }
        }
    }

    fn is_key_head(&self, row: &Row) -> bool {
        match &row.message.partition_key {
            None => true,
            Some(key) => self
                .key_pending
                .get(key)
                .and_then(|s| s.first())
                .is_none_or(|first| *first == row.seq),
        }
    }

    fn claimable(&self, id: MessageId, ordering: KeyOrder, now: SystemTime) -> bool {
        let Some(row) = self.rows.get(&id) else {
            return false;
        };
        row.is_pending()
            && row.available_at <= now
            && !self.locked.contains(&id)
            && (ordering == KeyOrder::Unordered || self.is_key_head(row))
    }

    fn lease(&mut self, id: MessageId, lease: Duration, now: SystemTime) -> ClaimedMessage {
        let token = LeaseToken::new();
        let expires_at = now + lease;
        self.move_due(id, expires_at);
        let row = self.rows.get_mut(&id).expect("claimed row exists");
        row.token = Some(token);
        row.message.attempts = row.message.attempts.saturating_add(1).min(MAX_ATTEMPTS);
        ClaimedMessage {
            message: row.message.clone(),
            lease: Lease {
                id,
                token,
                expires_at,
            },
        }
    }

    fn move_due(&mut self, id: MessageId, available_at: SystemTime) {
        let row = self.rows.get_mut(&id).expect("row exists");
        self.due.remove(&(row.available_at, row.seq, id));
        row.available_at = available_at;
        self.due.insert((available_at, row.seq, id));
    }

    fn dead_letter(&mut self, id: MessageId, reason: String, now: SystemTime) {
        self.unindex(id);
        let row = self.rows.get_mut(&id).expect("row exists");
        row.dead_at = Some(now);
        row.token = None;
        row.message.last_error = Some(reason);
    }

    /// Every dead letter matching `filter`, in no particular order.
    fn matching_dead<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> impl Iterator<Item = DeadLetter> + 'a {
        let now = SystemTime::now();
        self.rows
            .values()
            .filter_map(|r| r.dead_at.map(|at| DeadLetter::new(r.message.clone(), at)))
            .filter(move |d| filter.matches(d, now))
    }

    /// The dead letters of `page`: matching its filter, in its order past its cursor,
    /// at most its limit.
    fn dead(&self, page: &DeadLetterPage) -> Vec<DeadLetter> {
        let mut dead: Vec<DeadLetter> = self
            .matching_dead(page.filter())
            .filter(|d| page.is_past_cursor(d.message.id))
            .collect();
        dead.sort_by_key(|d| d.message.id);
        if page.order() == DeadLetterOrder::Descending {
            dead.reverse();
        }
        dead.truncate(page.limit());
        dead
    }

    /// The ids of the dead letters a selection names.
    fn selected(&self, selection: &DeadLetterSelection) -> Vec<MessageId> {
        match selection {
            DeadLetterSelection::Ids(ids) => ids
                .iter()
                .copied()
                .filter(|id| self.rows.get(id).is_some_and(|r| r.dead_at.is_some()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            DeadLetterSelection::Matching { filter, limit } => {
                let page = DeadLetterPage::new(filter.clone(), *limit)
                    .expect("a validated selection makes a valid page");
                self.dead(&page).into_iter().map(|d| d.message.id).collect()
            }
        }
    }

    /// Ids of dispatched messages completed before `cutoff` (strictly).
    fn dispatched_before(&self, cutoff: SystemTime) -> impl Iterator<Item = MessageId> + '_ {
        self.rows
            .values()
            .filter(move |r| r.dispatched_at.is_some_and(|at| at < cutoff))
            .map(|r| r.message.id)
    }

    fn holds(&self, lease: &Lease) -> bool {
        self.rows
            .get(&lease.id)
            .is_some_and(|r| r.is_pending() && r.token == Some(lease.token))
    }
}

/// An in-memory [`OutboxStore`] that honours the whole contract, including per-key
/// order, fencing, retention, lease renewal and row locks held by "another
/// transaction".
///
/// [`renew`](OutboxStore::renew) always works; whether the store *declares* it
/// ([`StoreCapabilities::lease_renewal`], which relays read) is the capabilities' it
/// was made with, so relays can be tested both ways.
///
/// It is the reference the conformance suite is checked against and a convenient
/// store for unit-testing services. Clones share state.
///
/// ```
/// # tokio_test_block(async {
/// use outbox_testkit::MemoryStore;
/// use outbox_core::{NewMessage, OutboxStore, store::ClaimRequest};
/// use std::time::Duration;
///
/// let store = MemoryStore::new();
/// let mut tx = store.begin();
/// tx.enqueue(NewMessage::builder("orders").payload(b"hi".to_vec()).build()?)?;
/// tx.commit()?;
/// let claimed = store.claim(ClaimRequest::new(10, Duration::from_secs(30))?).await?;
/// assert_eq!(claimed.len(), 1);
/// # Ok::<(), outbox_core::Error>(()) });
/// # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    capabilities: StoreCapabilities,
    limits: MessageLimits,
}

impl MemoryStore {
    /// An unordered store that deletes on completion.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with this ordering and retention.
    pub fn with_capabilities(capabilities: StoreCapabilities) -> Self {
        MemoryStore {
            capabilities,
            ..Self::default()
        }
    }

    /// Validate enqueued messages against these limits.
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start a "transaction": messages enqueued on it become visible on
    /// [`MemoryTx::commit`] and vanish if it is dropped.
    pub fn begin(&self) -> MemoryTx {
        MemoryTx {
            store: self.clone(),
            staged: Vec::new(),
        }
    }

    /// Enqueue and commit at once. All or nothing.
    ///
    /// # Errors
    /// As [`MemoryTx::enqueue`] and [`MemoryTx::commit`]; nothing is written.
    pub fn enqueue(&self, messages: &[NewMessage]) -> Result<()> {
        let mut tx = self.begin();
        for m in messages {
            tx.enqueue(m.clone())?;
        }
        tx.commit()
    }

    /// Hold `id` as another transaction's row lock would: claims skip it until
    /// [`unlock_row`](Self::unlock_row).
    pub fn lock_row(&self, id: MessageId) {
        self.state().locked.insert(id);
    }

    /// Make the lease on `id` lapse now, as if its lease time had passed: the message
    /// becomes claimable again, and the old lease still settles it until someone
    /// claims it anew. For tests of lapsed and stolen leases.
    pub fn expire_lease(&self, id: MessageId) {
        let mut state = self.state();
        let holds = state
            .rows
            .get(&id)
            .is_some_and(|r| r.is_pending() && r.token.is_some());
        if holds {
            state.move_due(id, SystemTime::now());
        }
    }

    /// Ids of undelivered (pending or in-flight) messages, in enqueue order.
    pub fn pending_ids(&self) -> Vec<MessageId> {
        let state = self.state();
        let mut rows: Vec<&Row> = state.rows.values().filter(|r| r.is_pending()).collect();
        rows.sort_by_key(|r| r.seq);
        rows.into_iter().map(|r| r.message.id).collect()
    }

    /// The `last_error` of every message that has one, in enqueue order.
    pub fn last_errors(&self) -> Vec<String> {
        let state = self.state();
        let mut rows: Vec<&Row> = state.rows.values().collect();
        rows.sort_by_key(|r| r.seq);
        rows.into_iter()
            .filter_map(|r| r.message.last_error.clone())
            .collect()
    }

    /// Stamp `id` as dispatched now and nothing else, as another tool writing to the
    /// store might (a dead letter stays dead): for
    /// [`Fixture::mark_dispatched`](crate::Fixture::mark_dispatched).
    pub fn mark_dispatched(&self, id: MessageId) {
        let mut state = self.state();
        if state.rows.get(&id).is_some_and(|r| r.dead_at.is_none()) {
            state.unindex(id);
        }
        if let Some(row) = state.rows.get_mut(&id) {
            row.dispatched_at = Some(SystemTime::now());
        }
    }

    /// End a [`lock_row`](Self::lock_row).
    pub fn unlock_row(&self, id: MessageId) {
        self.state().locked.remove(&id);
    }

    fn claim_where(
        &self,
        limit: usize,
        lease: Duration,
        mut wanted: impl FnMut(MessageId) -> bool,
    ) -> Claimed {
        let now = SystemTime::now();
        let ordering = self.capabilities.ordering;
        let mut state = self.state();
        let mut picked: Vec<MessageId> = Vec::new();
        for (available_at, _, id) in state.due.iter() {
            if picked.len() == limit || *available_at > now {
                break;
            }
            if !wanted(*id) || !state.claimable(*id, ordering, now) {
                continue;
            }
            picked.push(*id);
        }
        let mut claimed = Vec::with_capacity(picked.len());
        let mut dead_lettered = 0;
        for id in picked {
            let leased = state.lease(id, lease, now);
            match leased.message.check_stored(&self.limits) {
                Ok(()) => claimed.push(leased),
                Err(reason) => {
                    state.dead_letter(id, reason, now);
                    dead_lettered += 1;
                }
            }
        }
        Claimed::new(claimed).with_dead_lettered(dead_lettered)
    }

    fn settle(&self, leases: &[Lease], mut apply: impl FnMut(&mut State, usize)) -> Settled {
        let mut state = self.state();
        let mut applied = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            if state.holds(lease) {
                apply(&mut state, i);
                applied.push(lease.id);
            }
        }
        Settled::reconcile(leases.iter().map(|l| l.id), applied)
    }
}

/// A "transaction" on a [`MemoryStore`]: see [`MemoryStore::begin`].
#[derive(Debug)]
pub struct MemoryTx {
    store: MemoryStore,
    staged: Vec<NewMessage>,
}

impl MemoryTx {
    /// Stage a message, validated against the store's limits.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput); nothing is
    /// staged.
    pub fn enqueue(&mut self, message: NewMessage) -> Result<()> {
        self.store.limits.check(&message)?;
        self.staged.push(message);
        Ok(())
    }

    /// Make the staged messages visible, all or none.
    ///
    /// # Errors
    /// [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) when an id is already
    /// stored or staged twice; [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput)
    /// for a delay too long to represent. Nothing is written.
    pub fn commit(self) -> Result<()> {
        let now = SystemTime::now();
        let mut state = self.store.state();
        let mut ids = HashSet::new();
        let mut due = Vec::with_capacity(self.staged.len());
        let mut duplicates = Vec::new();
        for m in &self.staged {
            if state.rows.contains_key(&m.id()) || !ids.insert(m.id()) {
                duplicates.push(m.id());
            }
            due.push(later(now, m.delay())?);
        }
        if !duplicates.is_empty() {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("{} message ids are already in the outbox", duplicates.len()),
            )
            .with_ids(duplicates));
        }
        for (m, available_at) in self.staged.iter().zip(due) {
            state.insert(m, now, available_at);
        }
        Ok(())
    }

    /// Discard the staged messages (dropping does the same).
    pub fn rollback(self) {}
}

#[async_trait]
impl OutboxStore for MemoryStore {
    fn capabilities(&self) -> StoreCapabilities {
        self.capabilities
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        Ok(self.claim_where(request.limit(), request.lease(), |_| true))
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        let wanted: HashSet<MessageId> = request.ids().iter().copied().collect();
        Ok(self.claim_where(wanted.len(), request.lease(), |id| wanted.contains(&id)))
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        let now = SystemTime::now();
        let retention = self.capabilities.retention;
        Ok(self.settle(leases, |state, i| {
            let id = leases[i].id;
            state.unindex(id);
            match retention {
                Retention::Delete => {
                    state.rows.remove(&id);
                }
                Retention::Keep { .. } => {
                    let row = state.rows.get_mut(&id).expect("held row exists");
                    row.dispatched_at = Some(now);
                    row.token = None;
                }
            }
        }))
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        let now = SystemTime::now();
        let mut retry_at = Vec::with_capacity(failures.len());
        for f in failures {
            retry_at.push(match f.disposition() {
                Disposition::Retry { after } => later(now, after)?,
                Disposition::DeadLetter => now,
            });
        }
        let leases: Vec<Lease> = failures.iter().map(|f| *f.lease()).collect();
        Ok(self.settle(&leases, |state, i| {
            let f = &failures[i];
            let id = f.lease().id;
            match f.disposition() {
                Disposition::Retry { .. } => state.move_due(id, retry_at[i]),
                Disposition::DeadLetter => {
                    state.unindex(id);
                    state.rows.get_mut(&id).expect("row").dead_at = Some(now);
                }
            }
            let row = state.rows.get_mut(&id).expect("held row exists");
            row.token = None;
            row.message.last_error = Some(f.error().to_owned());
        }))
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        let now = SystemTime::now();
        Ok(self.settle(leases, |state, i| {
            let id = leases[i].id;
            state.move_due(id, now);
            let row = state.rows.get_mut(&id).expect("held row exists");
            row.token = None;
            row.message.attempts = row.message.attempts.saturating_sub(1);
        }))
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        outbox_core::backend::validate_lease(lease)?;
        let expires_at = later(SystemTime::now(), lease)?;
        let settled = self.settle(leases, |state, i| state.move_due(leases[i].id, expires_at));
        let lost: HashSet<MessageId> = settled.lost.iter().copied().collect();
        Ok(Renewed {
            leases: leases
                .iter()
                .filter(|l| !lost.contains(&l.id))
                .map(|l| Lease { expires_at, ..*l })
                .collect(),
            lost: settled.lost,
        })
    }
}

#[async_trait]
impl OutboxAdmin for MemoryStore {
    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        Ok(self.state().dead(page))
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        Ok(self.state().matching_dead(filter).count() as u64)
    }

    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        selection.validate()?;
        let now = SystemTime::now();
        let mut state = self.state();
        let ids = state.selected(selection);
        for id in &ids {
            let row = state.rows.get_mut(id).expect("selected rows exist");
            row.dead_at = None;
            row.dispatched_at = None;
            row.available_at = now;
            row.message.attempts = 0;
            let (available_at, seq, key) =
                (row.available_at, row.seq, row.message.partition_key.clone());
            state.due.insert((available_at, seq, *id));
            if let Some(key) = key {
                state.key_pending.entry(key).or_default().insert(seq);
            }
        }
        Ok(ids.len() as u64)
    }

    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        selection.validate()?;
        let mut state = self.state();
        let ids = state.selected(selection);
        for id in &ids {
            state.rows.remove(id);
        }
        Ok(ids.len() as u64)
    }

    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let mut state = self.state();
        let old: Vec<MessageId> = state
            .dispatched_before(purge_cutoff(older_than))
            .take(limit.min(MAX_ADMIN_BATCH))
            .collect();
        for id in &old {
            state.rows.remove(id);
        }
        Ok(old.len() as u64)
    }

    async fn count_dispatched(&self, older_than: Duration) -> Result<u64> {
        let state = self.state();
        Ok(state.dispatched_before(purge_cutoff(older_than)).count() as u64)
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let now = SystemTime::now();
        let state = self.state();
        let (mut pending, mut in_flight, mut dead, mut dispatched) = (0, 0, 0, 0);
        let mut oldest: Option<SystemTime> = None;
        for row in state.rows.values() {
            if row.dead_at.is_some() {
                dead += 1;
            } else if row.dispatched_at.is_some() {
                dispatched += 1;
            } else {
                if row.token.is_some() && row.available_at > now {
                    in_flight += 1;
                } else {
                    pending += 1;
                }
                let created = row.message.created_at;
                oldest = Some(oldest.map_or(created, |o| o.min(created)));
            }
        }
        let age = oldest.map(|o| now.duration_since(o).unwrap_or_default());
        Ok(OutboxStats::new(pending, in_flight, dead, dispatched, age))
    }
}

/// What a purge of messages dispatched more than `older_than` ago deletes: those
/// dispatched before this, stopping at the Unix epoch for huge ages.
fn purge_cutoff(older_than: Duration) -> SystemTime {
    SystemTime::now()
        .checked_sub(older_than)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// `now + delay`, or a typed error when that is past what the clock can represent.
fn later(now: SystemTime, delay: Duration) -> Result<SystemTime> {
    now.checked_add(delay)
        .ok_or_else(|| Error::invalid_input(format!("a delay of {delay:?} is too long")))
}
