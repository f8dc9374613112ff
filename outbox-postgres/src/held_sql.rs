//! The statements of held-lock claims ([`ClaimMode::HeldLock`](outbox_core::ClaimMode)),
//! built once from the validated name and config. See [`crate::held`] for the protocol.
//!
//! The claim selects the rows the lease claim would take, with the same predicate,
//! order and `FOR UPDATE SKIP LOCKED` (the `sql` module's `claim_parts`), and writes
//! nothing: it reads the columns and reports the attempt the claim starts (stored
//! attempts plus one). Settles reach rows by primary key as the lease settles do, with
//! no token to match (the row lock held since the claim is the fence), and stamp times
//! with `statement_timestamp()`, since `now()` in the held transaction is the claim's
//! start. Every settle also deletes the batch's registry row: that delete commits with
//! the settle that ends the batch, or rolls back with everything else.

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{KeyOrder, Retention};

use crate::config::PgOutboxConfig;
use crate::ident::QualifiedName;
use crate::schema::{held_table, UNDELIVERED};
use crate::sql::{by_primary_key, checked_time, claim_parts, Claim};

/// Prebuilt statement text of held-lock claims.
#[derive(Debug)]
pub(crate) struct HeldStatements {
    /// `$1` limit, `$2` lease µs: lock due rows and read them; also sets the
    /// transaction's `idle_in_transaction_session_timeout` to the lease and returns
    /// the transaction id as `held_xid` (text).
    pub(crate) claim: String,
    /// As `claim`, plus `$3` ids.
    pub(crate) claim_ids: String,
    /// As `claim`, plus `$3` ids it must not return (what a settle-and-claim settled).
    pub(crate) claim_excluding: String,
    /// `$1` ids: complete (delete or stamp dispatched); returns the ids applied.
    pub(crate) complete: String,
    /// `$1` ids, `$2` errors, `$3` dead flags, `$4` retry delays µs: record failed
    /// attempts; returns the ids applied.
    pub(crate) fail: String,
    /// `$1` ids, `$2` reasons: dead-letter claimed rows that cannot be delivered.
    pub(crate) dead_letter: String,
    /// No parameters: delete this transaction's registry row (a batch that ends with
    /// releases only).
    pub(crate) unregister: String,
    /// `$1` transaction id (text), `$2` ids: record an open batch (on another
    /// connection, committed before the relay publishes).
    pub(crate) register: String,
    /// `$1` lease µs: arm the idle timeout again; returns the new expiry.
    pub(crate) renew: String,
    /// No parameters: charge one attempt to the undelivered messages of one batch whose
    /// transaction ended without committing; see [`crate::held`].
    pub(crate) sweep: String,
    /// As the lease statistics, counting the messages of open batches as in flight.
    pub(crate) stats: String,
}

/// `$<param>` lease microseconds as the milliseconds of a timeout, at least 1 and at
/// most what the setting holds.
fn timeout_ms(param: &str) -> String {
    format!("greatest(1, least(ceil({param}::bigint / 1000.0), 2147483647))::bigint::text")
}

/// Attempts plus one, saturating at `MAX_ATTEMPTS` as the lease claim does.
fn next_attempt(column: &str) -> String {
    format!(
        "least({column}, {before_max}) + 1",
        before_max = i64::from(MAX_ATTEMPTS) - 1
    )
}

impl HeldStatements {
    pub(crate) fn new(t: &QualifiedName, config: &PgOutboxConfig) -> Self {
        let per_key = config.ordering() == KeyOrder::PerKey;
        let held = held_table(t);
        let unheld = format!("unheld AS (DELETE FROM {held} WHERE xid = pg_current_xact_id())");
        let by_key = by_primary_key("m", "l");
        let settle = |modify: String| {
            format!("WITH {unheld}, done AS ({modify} RETURNING m.id) SELECT id FROM done")
        };
        // Complete names ids only, so no join: one index scan of the primary key over
        // the array. (Joined to `unnest($1)`, a custom plan estimated the undelivered
        // rows low and rescanned the array once per row of the table: 2.4 s to
        // complete 1,000 of 12,000 messages.) Fail and dead-letter carry a value per id
        // and join, bounded the same way, so whichever side the planner drives from
        // reads only the listed rows.
        let listed = "m.id = ANY($1::uuid[]) AND coalesce(m.dispatched_at, m.dead_at) IS NULL";
        let complete = match config.retention() {
            Retention::Delete => format!("DELETE FROM {t} AS m WHERE {listed}"),
            Retention::Keep { .. } => {
                format!("UPDATE {t} AS m SET dispatched_at = statement_timestamp() WHERE {listed}")
            }
        };
        let by_key = format!("{by_key} AND m.id = ANY($1::uuid[])");
        let live = format!(
            "(SELECT x FROM {held} AS h, unnest(h.ids) AS x \
             WHERE pg_xact_status(h.xid) = 'in progress')"
        );
        HeldStatements {
            claim: claim(t, per_key, Claim::Due),
            claim_ids: claim(t, per_key, Claim::Ids).replace("$4::uuid[]", "$3::uuid[]"),
            claim_excluding: claim(t, per_key, Claim::Excluding)
                .replace("$6::uuid[]", "$3::uuid[]"),
            complete: settle(complete),
            fail: settle(format!(
                "UPDATE {t} AS m SET attempts = {attempt}, \
                 available_at = CASE WHEN l.dead THEN m.available_at \
                     ELSE statement_timestamp() + l.retry_us * interval '1 microsecond' END, \
                 dead_at = CASE WHEN l.dead THEN statement_timestamp() END, \
                 last_error = l.error \
                 FROM unnest($1::uuid[], $2::text[], $3::bool[], $4::bigint[]) \
                     AS l(id, error, dead, retry_us) \
                 WHERE {by_key}",
                attempt = next_attempt("m.attempts"),
            )),
            dead_letter: settle(format!(
                "UPDATE {t} AS m SET attempts = {attempt}, dead_at = statement_timestamp(), \
                 last_error = l.error \
                 FROM unnest($1::uuid[], $2::text[]) AS l(id, error) WHERE {by_key}",
                attempt = next_attempt("m.attempts"),
            )),
            unregister: format!("DELETE FROM {held} WHERE xid = pg_current_xact_id()"),
            register: format!("INSERT INTO {held} (xid, ids) VALUES ($1::text::xid8, $2::uuid[])"),
            renew: format!(
                "SELECT set_config('idle_in_transaction_session_timeout', {ms}, true) AS armed, \
                 statement_timestamp() + $1 * interval '1 microsecond' AS expires_at",
                ms = timeout_ms("$1"),
            ),
            sweep: sweep(t, &held),
            stats: format!(
                "SELECT \
                 count(*) FILTER (WHERE NOT (held OR leased)) AS pending, \
                 count(*) FILTER (WHERE held OR leased) AS in_flight, \
                 (extract(epoch FROM now() - min({created})) * 1000000)::bigint AS oldest_us, \
                 (SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL) AS dead, \
                 (SELECT count(*) FROM {t} WHERE dispatched_at IS NOT NULL) AS dispatched \
                 FROM (SELECT created_at, id IN {live} AS held, \
                     lease_token IS NOT NULL AND available_at > now() AS leased \
                     FROM {t} WHERE {UNDELIVERED}) AS u",
                created = crate::sql::clamp("created_at"),
            ),
        }
    }
}

/// The held claim: the lease claim's selection, reading instead of updating. Its times
/// are the statement's: the transaction may have begun long before (one kept ready by
/// the commit of the previous batch), and `now()` is the transaction's start.
fn claim(t: &QualifiedName, per_key: bool, which: Claim) -> String {
    let (ctes, _update) = claim_parts(t, per_key, which);
    let ctes = ctes.replace("now()", "statement_timestamp()");
    format!(
        "WITH {ctes} \
         SELECT m.id, m.destination, m.partition_key, m.payload, m.content_type, m.headers, \
             {created}, {attempt} AS attempts, m.last_error, \
             statement_timestamp() + $2 * interval '1 microsecond' AS lease_expires_at, \
             {due_at}, due.seq, \
             pg_current_xact_id()::text AS held_xid, \
             set_config('idle_in_transaction_session_timeout', {ms}, true) AS idle_timeout \
         FROM due JOIN {t} AS m ON m.ctid = due.ctid",
        created = checked_time("m.created_at", "created_at"),
        attempt = next_attempt("m.attempts"),
        due_at = checked_time("due.available_at", "due_at"),
        ms = timeout_ms("$2"),
    )
}

/// One batch of a transaction that ended without committing (aborted, or too old for
/// the server to say: a committed one deleted its row): charge an attempt to each of its
/// messages still undelivered and not locked by a live claim, keep in the row the ones
/// locked (charged by a later sweep), and delete the row when none are left. Returns
/// `gone` (rows taken: 0 or 1), `charged` and `kept`.
fn sweep(t: &QualifiedName, held: &str) -> String {
    let undelivered = "coalesce(m.dispatched_at, m.dead_at) IS NULL";
    format!(
        "WITH gone AS (SELECT h.xid, h.ids FROM {held} AS h \
             WHERE coalesce(pg_xact_status(h.xid), 'aborted') <> 'in progress' \
             ORDER BY h.xid LIMIT 1 FOR UPDATE OF h SKIP LOCKED), \
         free AS (SELECT m.id FROM gone, {t} AS m WHERE m.id = ANY(gone.ids) AND {undelivered} \
             FOR UPDATE OF m SKIP LOCKED), \
         charged AS (UPDATE {t} AS m SET attempts = {attempt} FROM free \
             WHERE m.id = free.id RETURNING m.id), \
         busy AS (SELECT m.id FROM gone, {t} AS m WHERE m.id = ANY(gone.ids) AND {undelivered} \
             AND m.id NOT IN (SELECT id FROM free)), \
         kept AS (UPDATE {held} AS h SET ids = array(SELECT id FROM busy) FROM gone \
             WHERE h.xid = gone.xid AND EXISTS (SELECT 1 FROM busy) RETURNING h.xid), \
         dropped AS (DELETE FROM {held} AS h USING gone \
             WHERE h.xid = gone.xid AND NOT EXISTS (SELECT 1 FROM busy) RETURNING h.xid) \
         SELECT (SELECT count(*) FROM gone) AS gone, (SELECT count(*) FROM charged) AS charged, \
             (SELECT count(*) FROM kept) AS kept, (SELECT count(*) FROM dropped) AS dropped",
        attempt = next_attempt("m.attempts"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(config: PgOutboxConfig) -> HeldStatements {
        let config = config.with_schema("s").with_table("t");
        HeldStatements::new(&config.qualified_name().unwrap(), &config)
    }

    #[test]
    fn the_claim_locks_skipping_locked_rows_and_writes_nothing() {
        let s = statements(PgOutboxConfig::default());
        for claim in [&s.claim, &s.claim_ids, &s.claim_excluding] {
            assert!(claim.contains("FOR UPDATE OF c SKIP LOCKED"), "{claim}");
            assert!(!claim.contains("UPDATE \"s\".\"t\""), "{claim}");
            assert!(claim.contains("least(m.attempts, 2147483646) + 1 AS attempts"));
            assert!(claim.contains("idle_in_transaction_session_timeout"));
            assert!(claim.contains("pg_current_xact_id()::text AS held_xid"));
            assert!(
                !claim.contains("now()"),
                "a ready transaction's now() is old"
            );
            assert!(claim.contains("c.available_at <= statement_timestamp()"));
        }
        assert!(s.claim_ids.contains("c.id = ANY($3::uuid[])"));
        assert!(!s.claim_ids.contains("$4"));
        assert!(s
            .claim_excluding
            .contains("NOT IN (SELECT x FROM unnest($3::uuid[])"));
        assert!(!s.claim_excluding.contains("$6"));
    }

    #[test]
    fn settles_end_the_registry_row_and_stamp_the_statement_time() {
        let s = statements(PgOutboxConfig::default());
        for settle in [&s.complete, &s.fail, &s.dead_letter] {
            assert!(
                settle.contains("DELETE FROM \"s\".\"t_held\" WHERE xid = pg_current_xact_id()"),
                "{settle}"
            );
            assert!(!settle.contains("now()"), "{settle}");
        }
        assert!(s.complete.starts_with("WITH unheld AS"));
        assert!(s
            .complete
            .contains("DELETE FROM \"s\".\"t\" AS m WHERE m.id = ANY($1::uuid[])"));
        for joined in [&s.fail, &s.dead_letter] {
            assert!(joined.contains("AND m.id = ANY($1::uuid[])"), "{joined}");
        }
        let kept = statements(PgOutboxConfig::default().with_retention(Retention::Keep {
            window: std::time::Duration::from_secs(60),
        }));
        assert!(kept
            .complete
            .contains("SET dispatched_at = statement_timestamp()"));
    }

    #[test]
    fn the_idle_timeout_is_the_lease_in_whole_milliseconds() {
        assert_eq!(
            timeout_ms("$2"),
            "greatest(1, least(ceil($2::bigint / 1000.0), 2147483647))::bigint::text"
        );
    }

    #[test]
    fn the_sweep_takes_only_ended_transactions_and_skips_locked_rows() {
        let s = statements(PgOutboxConfig::default());
        assert!(s
            .sweep
            .contains("coalesce(pg_xact_status(h.xid), 'aborted') <> 'in progress'"));
        assert!(s.sweep.contains("FOR UPDATE OF h SKIP LOCKED"));
        assert!(s.sweep.contains("FOR UPDATE OF m SKIP LOCKED"));
        assert!(s.stats.contains("pg_xact_status(h.xid) = 'in progress'"));
    }
}
