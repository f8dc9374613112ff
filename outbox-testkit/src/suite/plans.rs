//! Plans on a table with history: every statement a relay sends reaches the outbox's
//! rows through an index, and statements that name their rows reach them by key
//! ([`PlanHarness`]).

use std::time::Duration;

use outbox_core::{store::StoreCapabilities, KeyOrder, Retention};

use crate::harness::plan::{Access, History, PlanHarness, RelayOp};

/// 100,000 rows: mostly history, a backlog, dead letters, retries waiting.
const HISTORY: History = History {
    dispatched: 80_000,
    dead: 5_000,
    due: 10_000,
    waiting: 5_000,
};

/// Unordered, deleting on completion: the default store (its history is only the
/// backlog and the dead letters).
pub async fn plans_reach_rows_through_indexes(h: &dyn PlanHarness) {
    let history = History {
        dispatched: 0,
        due: HISTORY.due + HISTORY.dispatched,
        ..HISTORY
    };
    check(h, StoreCapabilities::default(), history).await;
}

/// Ordered per key, keeping dispatched history: the store with the most indexes and
/// the most rows to pass over.
pub async fn plans_reach_rows_through_indexes_per_key_with_history(h: &dyn PlanHarness) {
    let caps = StoreCapabilities::new(
        KeyOrder::PerKey,
        Retention::Keep {
            window: Duration::from_secs(3600),
        },
    );
    check(h, caps, HISTORY).await;
}

async fn check(h: &dyn PlanHarness, caps: StoreCapabilities, history: History) {
    let f = h
        .fixture(caps)
        .await
        .expect("harness could not make a fixture");
    f.add_history(history)
        .await
        .expect("harness could not load history");
    let stats = f.fixture().admin().stats().await.unwrap();
    let count = |n: usize| n as u64;
    assert_eq!(
        (stats.pending, stats.in_flight, stats.dead, stats.dispatched),
        (
            count(history.due + history.waiting),
            0,
            count(history.dead),
            count(history.dispatched)
        ),
        "add_history wrote {history:?}"
    );
    let renews = f.fixture().store().capabilities().lease_renewal;
    for op in RelayOp::ALL {
        if op == RelayOp::Renew && !renews {
            // Nothing to plan: the store refuses renewal without a statement
            // (`renewal_is_refused_unless_declared` checks that).
            continue;
        }
        if op == RelayOp::Purge && caps.retention == Retention::Delete {
            // Nothing is kept to purge: a store may send nothing.
            continue;
        }
        let plans = f
            .plans(op)
            .await
            .unwrap_or_else(|e| panic!("{op:?}: the harness could not read plans: {e}"));
        assert!(!plans.is_empty(), "{op:?}: the harness returned no plans");
        for plan in &plans {
            assert!(
                !plan.accesses.is_empty(),
                "{op:?}: a statement that never reads the outbox table?\n{plan}"
            );
            let scans: Vec<_> = plan
                .accesses
                .iter()
                .filter(|a| matches!(a, Access::Scan(_)))
                .collect();
            assert!(
                scans.is_empty(),
                "{op:?} ({caps:?}) scans on a table with history: {scans:?}\n{plan}"
            );
            if op.names_its_rows() {
                assert_eq!(
                    plan.accesses[0],
                    Access::ByKey,
                    "{op:?} ({caps:?}) names its rows but does not reach them by key\n{plan}"
                );
            }
            if op.is_settle() {
                assert!(
                    plan.accesses.iter().all(|a| *a == Access::ByKey),
                    "{op:?} ({caps:?}) settles through something else than the key\n{plan}"
                );
            }
        }
        if matches!(op, RelayOp::Claim | RelayOp::Purge) {
            assert!(
                plans
                    .iter()
                    .flat_map(|p| &p.accesses)
                    .any(|a| matches!(a, Access::Index(_))),
                "{op:?} finds its rows through a secondary index: {plans:#?}"
            );
        }
    }
}
