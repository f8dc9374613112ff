//! The statements of held-lock claims ([`ClaimMode::HeldLock`](outbox_core::ClaimMode))
//! on InnoDB, built once from the validated name and config. See [`crate::held`] for
//! the protocol.
//!
//! The claims choose rows as the lease claims do and report what they report (stored
//! attempts plus one, the lease's expiry), but write nothing and lock by primary key
//! (see [`claim`]). Settles reach rows by primary key with no token to match:
//! the row lock held since the claim is the fence. A failure writes the attempt the
//! claim reported, as the lease claim's stamp would have.

use outbox_core::store::MAX_ATTEMPTS;

use outbox_core::KeyOrder;
#[cfg(test)]
use outbox_core::Retention;

use crate::config::{MySqlOutboxConfig, QualifiedName};
use crate::sql::{Statements, COLUMNS, NOW};

/// Prebuilt statement text of held-lock claims; `{ids}` marks an id list
/// ([`with_ids`](crate::sql::with_ids)).
#[derive(Debug)]
pub(crate) struct HeldStatements {
    /// Lease µs, limit: lock due rows and read them.
    pub(crate) claim: String,
    /// Lease µs, ids, limit: as `claim`, of the listed ids.
    pub(crate) claim_ids: String,
    /// Lease µs, ids, limit: as `claim`, skipping the listed ids (what a
    /// settle-and-claim settled).
    pub(crate) claim_excluding: String,
    /// Ids (a JSON array of hex): complete (delete or stamp dispatched), each reached by
    /// primary key from the array: the lease complete (see `crate::sql`).
    pub(crate) complete: String,
    /// One JSON array of `[id, token, error, dead, retry µs]` rows (the lease fail's
    /// shape, the token ignored): record failed attempts.
    pub(crate) fail: String,
    /// Seconds: bound how long the session's transaction may sit idle.
    pub(crate) arm: String,
    /// Batch (hex), ids (a JSON array of hex): record an open batch, on another
    /// connection, committed before the relay publishes.
    pub(crate) register: String,
    /// Batch (hex): lock its registry row in the batch's transaction, so sweeps skip it
    /// while the batch lives.
    pub(crate) hold: String,
    /// End a transaction's batch and begin the next: commit, release the batch's lock
    /// ([`batch_lock`]), begin.
    pub(crate) commit: &'static str,
    /// As `commit`, rolling back.
    pub(crate) rollback: &'static str,
    /// Batch: delete its registry row (in the batch's transaction, before it commits).
    pub(crate) unregister: String,
    /// Lock up to 64 registry rows no live batch holds, oldest first: `batch`, `ids`.
    pub(crate) swept: String,
    /// Ids (a JSON array of hex): the undelivered ones no live claim holds, locked.
    pub(crate) free: String,
    /// Ids (a JSON array of hex): the undelivered ones, read without locking.
    pub(crate) undelivered: String,
    /// Ids (a JSON array of hex): charge an attempt.
    pub(crate) charge: String,
    /// Batches (a JSON array of hex): delete their registry rows.
    pub(crate) drop_batches: String,
    /// Ids (a JSON array of hex), batch: keep only these ids in the batch's row.
    pub(crate) keep: String,
    /// As the lease statistics, counting the messages of registered batches as in
    /// flight.
    pub(crate) stats: String,
}

/// The prefix of a batch's user-level lock: `obx-held-` and the batch's 32 hex digits.
const BATCH_LOCK_PREFIX: &str = "obx-held-";

/// The user-level lock (`GET_LOCK`) a batch's session holds from its claim until its
/// transaction ends: what tells a sweep that the batch is alive in the moment between its
/// registry row's commit and the batch's lock on that row. The server frees it with the
/// session.
pub(crate) fn batch_lock(batch: &str) -> String {
    format!("{BATCH_LOCK_PREFIX}{batch}")
}

/// `<table>_held`, in the outbox's database.
pub(crate) fn held_table(t: &QualifiedName) -> String {
    format!("{}.{}", t.quoted_schema(), t.quoted_derived("held"))
}

/// Attempts plus one, saturating at `MAX_ATTEMPTS` as the lease claim does.
fn next_attempt(column: &str) -> String {
    format!("IF({column} < {MAX_ATTEMPTS}, {column} + 1, {column})")
}

impl HeldStatements {
    pub(crate) fn new(t: &QualifiedName, config: &MySqlOutboxConfig, lease: &Statements) -> Self {
        let per_key = config.ordering() == KeyOrder::PerKey;
        let held = held_table(t);
        let json_ids = "JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j";
        let by_json =
            format!("{json_ids} STRAIGHT_JOIN {t} FORCE INDEX (PRIMARY) ON {t}.id = UNHEX(j.h)");
        let registered = format!(
            "SELECT UNHEX(r.h) FROM {held} AS b, \
             JSON_TABLE(b.ids, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS r"
        );
        let due = t.quoted_derived("due");
        HeldStatements {
            claim: claim(t, &due, "", &registered, per_key),
            claim_ids: claim(t, "PRIMARY", "c.id IN ({ids}) AND ", &registered, per_key),
            claim_excluding: claim(t, &due, "c.id NOT IN ({ids}) AND ", &registered, per_key),
            complete: lease.complete.clone(),
            fail: format!(
                "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$[0]', e TEXT CHARACTER \
                 SET utf8mb4 PATH '$[2]', d INT PATH '$[3]', r BIGINT PATH '$[4]')) AS j \
                 STRAIGHT_JOIN {t} FORCE INDEX (PRIMARY) ON {t}.id = UNHEX(j.h) \
                 SET attempts = {attempt}, lease_token = NULL, last_error = j.e, \
                 dead_at = IF(j.d, {NOW}, NULL), \
                 available_at = IF(j.d, available_at, {NOW} + INTERVAL j.r MICROSECOND) \
                 WHERE {t}.due_at IS NOT NULL",
                attempt = next_attempt("attempts"),
            ),
            arm: "SET SESSION idle_transaction_timeout = ?".to_owned(),
            register: format!(
                "INSERT INTO {held} (batch, ids, held_at) VALUES (UNHEX(?), ?, {NOW})"
            ),
            hold: format!("SELECT batch FROM {held} WHERE batch = UNHEX(?) FOR UPDATE"),
            unregister: format!("DELETE FROM {held} WHERE batch = ?"),
            commit: "COMMIT; DO RELEASE_ALL_LOCKS(); BEGIN",
            rollback: "ROLLBACK; DO RELEASE_ALL_LOCKS(); BEGIN",
            swept: format!(
                "SELECT HEX(batch) AS batch, CAST(ids AS CHAR) AS ids FROM {held} \
                 WHERE IS_USED_LOCK(CONCAT('{BATCH_LOCK_PREFIX}', LOWER(HEX(batch)))) IS NULL \
                 ORDER BY held_at, batch LIMIT 64 \
                 FOR UPDATE SKIP LOCKED"
            ),
            free: format!(
                "SELECT {t}.id FROM {by_json} WHERE {t}.due_at IS NOT NULL FOR UPDATE SKIP LOCKED"
            ),
            undelivered: format!("SELECT {t}.id FROM {by_json} WHERE {t}.due_at IS NOT NULL"),
            charge: format!(
                "UPDATE {by_json} SET attempts = {attempt} WHERE {t}.due_at IS NOT NULL",
                attempt = next_attempt("attempts"),
            ),
            drop_batches: format!(
                "DELETE b FROM {json_ids} STRAIGHT_JOIN {held} AS b ON b.batch = UNHEX(j.h)"
            ),
            keep: format!("UPDATE {held} SET ids = ? WHERE batch = UNHEX(?)"),
            stats: format!(
                "SELECT COUNT(IF(NOT (held OR leased), 1, NULL)) AS pending, \
                 COUNT(IF(held OR leased, 1, NULL)) AS in_flight, \
                 TIMESTAMPDIFF(MICROSECOND, MIN(created_at), {NOW}) AS oldest_us, \
                 (SELECT COUNT(*) FROM {t} FORCE INDEX ({dead}) WHERE dead_flag = 1) AS dead, \
                 (SELECT COUNT(*) FROM {t} FORCE INDEX ({dispatched}) \
                     WHERE dispatched_at IS NOT NULL) AS dispatched \
                 FROM (SELECT created_at, id IN ({registered}) AS held, \
                     lease_token IS NOT NULL AND available_at > {NOW} AS leased \
                     FROM {t} FORCE INDEX ({due}) WHERE due_at IS NOT NULL) AS u",
                dead = t.quoted_derived("dead"),
                dispatched = t.quoted_derived("dispatched"),
            ),
        }
    }
}

/// A held claim: the due rows not registered to an open batch, chosen by a plain read
/// (as the lease claim chooses them, per-key heads included), then locked by primary
/// key, skipping locked ones, and read; the session takes the batch's lock
/// ([`batch_lock`]) with the rows. Parameters: lease µs, the batch's lock, the ids
/// `which` lists, the candidates' limit, the claim's limit.
///
/// Two steps because a locking range scan that finds fewer rows than its limit also
/// locks the first row past its range, and InnoDB keeps that lock to the end of the
/// transaction even at READ COMMITTED: a held batch would hold the next message to
/// come due. Locks taken by primary key equality take only the rows named.
fn claim(t: &QualifiedName, index: &str, which: &str, registered: &str, per_key: bool) -> String {
    let head = if per_key {
        format!(
            " AND (c.partition_key IS NULL OR c.seq = (SELECT e.seq FROM {t} AS e \
             FORCE INDEX ({key}) WHERE e.key_head = c.partition_key ORDER BY e.seq LIMIT 1))",
            key = t.quoted_derived("key")
        )
    } else {
        String::new()
    };
    format!(
        "SELECT {COLUMNS}, {attempt} AS attempts, due_at + INTERVAL 0 SECOND AS due_time, seq, \
         {NOW} + INTERVAL ? MICROSECOND AS lease_expires_at, GET_LOCK(?, 0) AS batch_lock \
         FROM (SELECT c.id AS cid FROM {t} AS c FORCE INDEX ({index}) \
             WHERE {which}c.due_at <= {NOW}{head} AND c.id NOT IN ({registered}) \
             ORDER BY c.due_at, c.seq LIMIT ?) AS x \
         STRAIGHT_JOIN {t} AS m FORCE INDEX (PRIMARY) ON m.id = x.cid \
         WHERE m.due_at <= {NOW} ORDER BY m.due_at, m.seq LIMIT ? FOR UPDATE SKIP LOCKED",
        attempt = next_attempt("attempts"),
    )
}

/// The registry table's DDL.
pub(crate) fn held_registry(t: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {held} (
    batch BINARY(16) NOT NULL PRIMARY KEY,
    ids JSON NOT NULL,
    held_at DATETIME(6) NOT NULL,
    KEY {held_at} (held_at)
) ENGINE = InnoDB;
",
        held = held_table(t),
        held_at = t.quoted_derived("held_at"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements() -> HeldStatements {
        let config = MySqlOutboxConfig::default()
            .with_schema("s")
            .with_table("t");
        let name = config.qualified_name().unwrap();
        HeldStatements::new(&name, &config, &Statements::new(&name, &config))
    }

    #[test]
    fn the_claims_lock_skipping_locked_rows_and_write_nothing() {
        let s = statements();
        for claim in [&s.claim, &s.claim_ids, &s.claim_excluding] {
            assert!(claim.starts_with("SELECT "), "{claim}");
            assert!(claim.ends_with("FOR UPDATE SKIP LOCKED"), "{claim}");
            assert!(claim.contains("IF(attempts < 2147483647, attempts + 1, attempts) AS attempts"));
        }
        assert!(s
            .claim_excluding
            .contains("WHERE c.id NOT IN ({ids}) AND c.due_at <="));
        assert!(s.claim_excluding.contains("FORCE INDEX (`t_due`)"));
    }

    #[test]
    fn a_held_complete_reaches_each_row_by_primary_key() {
        let s = statements();
        assert!(
            s.complete.starts_with("DELETE `s`.`t` FROM JSON_TABLE(?, "),
            "{}",
            s.complete
        );
        assert!(s
            .complete
            .contains("STRAIGHT_JOIN `s`.`t` FORCE INDEX (PRIMARY) ON `s`.`t`.id = UNHEX(j.h)"));
        let config = MySqlOutboxConfig::default()
            .with_schema("s")
            .with_table("t")
            .with_retention(Retention::Keep {
                window: std::time::Duration::from_secs(60),
            });
        let name = config.qualified_name().unwrap();
        let keep = HeldStatements::new(&name, &config, &Statements::new(&name, &config)).complete;
        assert!(keep.starts_with("UPDATE JSON_TABLE(?, "), "{keep}");
        assert!(keep.ends_with("WHERE `s`.`t`.due_at IS NOT NULL"), "{keep}");
    }

    #[test]
    fn a_held_failure_writes_the_attempt_and_matches_no_token() {
        let s = statements();
        assert!(s
            .fail
            .contains("SET attempts = IF(attempts < 2147483647, attempts + 1, attempts)"));
        let fenced = s.fail.replace("lease_token = NULL", "");
        assert!(!fenced.contains("lease_token"), "{fenced}");
        assert!(s.fail.contains("WHERE `s`.`t`.due_at IS NOT NULL"));
    }

    #[test]
    fn the_sweep_skips_what_live_claims_and_ending_batches_lock() {
        let s = statements();
        assert!(s.swept.ends_with("FOR UPDATE SKIP LOCKED"));
        assert!(s
            .swept
            .contains("WHERE IS_USED_LOCK(CONCAT('obx-held-', LOWER(HEX(batch)))) IS NULL"));
        for claim in [&s.claim, &s.claim_ids, &s.claim_excluding] {
            assert!(claim.contains("GET_LOCK(?, 0) AS batch_lock"), "{claim}");
        }
        assert_eq!(
            batch_lock(&"ab".repeat(16)).len(),
            41,
            "at most 64 characters"
        );
        assert!(s.free.ends_with("FOR UPDATE SKIP LOCKED"));
        assert!(!s.undelivered.contains("FOR UPDATE"));
        assert!(s.stats.contains("`s`.`t_held`"));
    }
}
