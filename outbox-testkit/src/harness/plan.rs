//! What a backend with a query planner implements so the kit can check that the
//! statements a relay sends reach rows through their indexes on a table with history.
//!
//! Every suite can pass while a settle is planned as a scan of the whole outbox: the
//! rows are few and the answer is right. The plan suite
//! ([`plan_suite!`](crate::plan_suite)) loads a table with history the way a busy
//! service's table looks (mostly settled rows, some dead, a backlog) without letting
//! the engine gather statistics, then asks the backend for the plans of what each relay
//! operation sends, and fails on a scan of the table.

use std::fmt;

use async_trait::async_trait;
use outbox_core::{store::StoreCapabilities, Result};

use crate::harness::Fixture;

/// How one step of a plan reaches the outbox table's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// By the table's key: the primary key, a unique index on `id`, a row address.
    ByKey,
    /// Through the named secondary index (a range of it, not all of it).
    Index(String),
    /// The whole table, or the whole of an index read in its order: what a relay
    /// statement must never do on a table with history.
    Scan(String),
}

/// One statement an operation sent, with the plan the engine made for it.
#[derive(Debug, Clone)]
pub struct PlannedStatement {
    /// The statement text, for messages.
    pub text: String,
    /// Which plan this is (for example `custom` or `generic`), for messages.
    pub variant: String,
    /// The engine's plan as it prints it, for messages.
    pub plan: String,
    /// Every access to the outbox table the plan makes, in plan order.
    pub accesses: Vec<Access>,
}

impl fmt::Display for PlannedStatement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} plan of\n{}\n{}\n=> {:?}",
            self.variant, self.text, self.plan, self.accesses
        )
    }
}

/// A relay operation whose statements the plan suite checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayOp {
    /// [`OutboxStore::claim`](outbox_core::OutboxStore::claim).
    Claim,
    /// [`OutboxStore::claim_ids`](outbox_core::OutboxStore::claim_ids).
    ClaimIds,
    /// [`OutboxStore::complete`](outbox_core::OutboxStore::complete).
    Complete,
    /// [`OutboxStore::fail`](outbox_core::OutboxStore::fail).
    Fail,
    /// [`OutboxStore::release`](outbox_core::OutboxStore::release).
    Release,
    /// [`OutboxStore::renew`](outbox_core::OutboxStore::renew), on stores that declare
    /// renewal.
    Renew,
    /// [`OutboxStore::settle_and_claim`](outbox_core::OutboxStore::settle_and_claim).
    SettleAndClaim,
    /// [`OutboxAdmin::purge_dispatched`](outbox_core::OutboxAdmin::purge_dispatched),
    /// what the [`Purger`](outbox_core::Purger) sends: it must find dispatched rows
    /// through an index, not by reading the backlog and the history.
    Purge,
}

impl RelayOp {
    /// Every operation, claims first.
    pub const ALL: [RelayOp; 8] = [
        RelayOp::Claim,
        RelayOp::ClaimIds,
        RelayOp::SettleAndClaim,
        RelayOp::Complete,
        RelayOp::Fail,
        RelayOp::Release,
        RelayOp::Renew,
        RelayOp::Purge,
    ];

    /// Whether the operation acts only on rows it names by id, so that its first
    /// access to the table must be [`Access::ByKey`] (later ones may probe an index,
    /// as a per-key claim probes each key's head).
    pub fn names_its_rows(self) -> bool {
        self.is_settle() || self == RelayOp::ClaimIds
    }

    /// Whether the operation settles leases (complete, fail, release, renew), so that
    /// every access must be [`Access::ByKey`]: a settle planned through the due index
    /// walks the whole backlog per id.
    pub fn is_settle(self) -> bool {
        matches!(
            self,
            RelayOp::Complete | RelayOp::Fail | RelayOp::Release | RelayOp::Renew
        )
    }
}

/// How many rows of each kind [`PlanFixture::add_history`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    /// Dispatched rows (kept history; 0 when the store deletes on completion).
    pub dispatched: usize,
    /// Dead letters.
    pub dead: usize,
    /// Undelivered rows due now, unleased (the backlog).
    pub due: usize,
    /// Undelivered rows due in an hour (retries waiting).
    pub waiting: usize,
}

/// Hands out stores whose plans the suite reads.
#[async_trait]
pub trait PlanHarness: Send + Sync + 'static {
    /// A fresh, empty store with these capabilities, in its own table, as
    /// [`Harness::fixture`](crate::Harness::fixture) makes one. The suite asks for
    /// per-key order and kept history as well as the defaults.
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn PlanFixture>>;
}

/// One case's store, plus the backend's hooks for loading history and reading plans.
#[async_trait]
pub trait PlanFixture: Send + Sync + fmt::Debug {
    /// The store under test, as the conformance suite's [`Fixture`] gives it (the suite
    /// reads its capabilities and, through its admin, checks the history loaded).
    fn fixture(&self) -> &dyn Fixture;

    /// Write `history` in bulk (one or a few statements, keys spread over a handful of
    /// partition keys when the store orders per key), leaving the engine without
    /// statistics on the table: turn automatic statistics off for it first where the
    /// engine gathers them by itself.
    async fn add_history(&self, history: History) -> Result<()>;

    /// The plans of every statement the store sends for `op` against the table as it
    /// is now, in each plan variant the engine may use for it (a prepared statement's
    /// custom and generic plans). Capture what the store really sends where the engine
    /// can tell (PostgreSQL's `pg_prepared_statements`); otherwise ask the store for
    /// the statements it runs for `op`. Running `op` must leave the rows as they were
    /// (roll back, or settle leases nobody holds).
    async fn plans(&self, op: RelayOp) -> Result<Vec<PlannedStatement>>;
}
