//! The connections a [`PgOutbox`](crate::PgOutbox) runs the relay's statements on:
//! their own pool, whose sessions forbid the plan shapes that turn a claim or a settle
//! into a scan, so those statements can be prepared once and run with any plan.
//!
//! # Why
//!
//! A prepared statement's generic plan is made once and kept for the session. Made
//! while the table was small or never analyzed, the planner's cheapest plan for a
//! settle was a sequential scan joined to the ids (2.7 s per 100-row settle once the
//! table had grown to 100,000 rows without statistics), and nothing replans it until
//! statistics change. The alternative, planning every call, cost a second round trip
//! and a plan per batch.
//!
//! Here each session sets [`PLANNER_SETTINGS`]: sequential and bitmap scans, hash and
//! merge joins, explicit sorts, materialisation and memoisation are priced out, so the
//! planner reaches rows only through indexes, by nested loops driven from the bound
//! ids, whatever the statistics say, for custom and generic plans alike. The statements
//! are written so that this leaves one sensible plan each (see the `sql` module): the
//! claim walks the due index in its order, and every statement that names ids states
//! "undelivered" in a form no partial index matches, so the primary key is their only
//! index. JIT is off too: a priced-out node that has no alternative (a sort of claimed
//! ids) must not push a cheap statement past `jit_above_cost`.
//!
//! The pool is a sibling of the caller's: same connect options and acquire timeout, its
//! own connections (at most [`PgOutboxConfig::relay_connections`](crate::PgOutboxConfig::relay_connections),
//! opened on first use). The settings never reach the caller's own pool, and enqueues
//! run on the caller's transaction as before.

use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

/// What every relay session sets when it connects.
pub(crate) const PLANNER_SETTINGS: &str = "SET enable_seqscan = off; \
     SET enable_bitmapscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off; \
     SET enable_sort = off; SET enable_material = off; SET enable_memoize = off; \
     SET jit = off";

/// A lazily connecting pool beside `pool`, at most `max` connections, whose sessions
/// set [`PLANNER_SETTINGS`].
pub(crate) fn relay_pool(pool: &PgPool, max: u32) -> PgPool {
    let options = pool.connect_options();
    PgPoolOptions::new()
        .max_connections(max.max(1))
        .min_connections(0)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(PLANNER_SETTINGS).await?;
                Ok(())
            })
        })
        .connect_lazy_with((*options).clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_that_prices_out_a_scan_shape_is_set() {
        for setting in [
            "enable_seqscan = off",
            "enable_bitmapscan = off",
            "enable_hashjoin = off",
            "enable_mergejoin = off",
            "enable_sort = off",
            "enable_material = off",
            "enable_memoize = off",
            "jit = off",
        ] {
            assert!(PLANNER_SETTINGS.contains(setting), "{setting}");
        }
        for kept in ["enable_indexscan", "enable_nestloop", "enable_tidscan"] {
            assert!(!PLANNER_SETTINGS.contains(kept), "{kept} must stay on");
        }
    }
}
