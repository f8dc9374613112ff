//! The statements a [`SqliteOutbox`](crate::SqliteOutbox) runs, built once from its
//! validated table name and config.
//!
//! Only a [`TableName`] is formatted into the text; every value is a bound parameter.
//! SQLite has no array parameters, so batch statements take one JSON array and read it
//! with `json_each`: a batch is one statement however many messages it carries. Ids and
//! tokens travel in it as hex and are turned back into blobs with `unhex`.
//!
//! # Access paths
//!
//! - The **claim** reads the partial `<table>_due` index, stating the undelivered
//!   predicate exactly as the index does ([`UNDELIVERED`]), and the `<table>_key`
//!   index for the head of each key under per-key order.
//! - **Settles** reach rows through the unique index on `id`, and state "undelivered"
//!   as `coalesce(dispatched_at, dead_at) IS NULL`, which no partial index matches.
//! - **Admin** statements on dead letters read the `<table>_dead` index.

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{DeadLetterOrder, KeyOrder, Retention};
use outbox_sqlx::AdminStatements;

use crate::config::SqliteOutboxConfig;
use crate::ident::TableName;
use crate::schema::UNDELIVERED;

/// The columns a claim returns, in the order [`crate::row`] reads them.
/// Text columns are read as bytes (see `row.rs`): a `TEXT` column can hold bytes that
/// are not UTF-8.
pub(crate) const CLAIMED_COLUMNS: &str = "seq, id, CAST(destination AS BLOB), \
     CAST(partition_key AS BLOB), payload, CAST(content_type AS BLOB), \
     CAST(headers AS BLOB), created_at, attempts, CAST(last_error AS BLOB), available_at";

/// Prebuilt statement text.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `?1` limit, `?2` now: the due rows' `seq` and `available_at`, in claim order.
    pub(crate) claim_select: String,
    /// As `claim_select`, plus `?3` a JSON array of hex ids.
    pub(crate) claim_ids_select: String,
    /// `?1` JSON array of seqs, `?2` lease expiry, `?3` token: stamp the lease.
    pub(crate) claim_update: String,
    /// `?1` JSON array of `[seq, reason]`, `?2` now, `?3` token: dead-letter claimed
    /// rows that cannot be delivered.
    pub(crate) dead_letter_claimed: String,
    /// `?1` JSON array of `[id, token]`, `?2` now.
    pub(crate) complete: String,
    /// `?1` JSON array of `[id, token, error, dead, retry_us]`, `?2` now.
    pub(crate) fail: String,
    /// `?1` JSON array of `[id, token]`, `?2` now.
    pub(crate) release: String,
    /// Lowest id first: `?1..?3` the filter ([`DEAD_FILTER`]), `?4` limit, `?5` the id
    /// to start after or NULL.
    pub(crate) dead_letters: String,
    /// As `dead_letters`, highest id first.
    pub(crate) dead_letters_desc: String,
    /// Count, requeue, discard and purge: [`AdminStatements`] gives their parameters,
    /// bound as the outbox's [`SqlxAdmin`](outbox_sqlx::SqlxAdmin) impl binds them.
    pub(crate) admin: AdminStatements,
    /// `?1` now.
    pub(crate) stats: String,
}

impl Statements {
    pub(crate) fn new(t: &TableName, config: &SqliteOutboxConfig) -> Self {
        let per_key = config.ordering() == KeyOrder::PerKey;
        // Settles join the bound leases on `id` (unique index) and match the token.
        let leases = "(SELECT unhex(value ->> 0) AS id, unhex(value ->> 1) AS token \
                      FROM json_each(?1)) AS l";
        let settle = |set: &str, from: &str| {
            format!(
                "UPDATE {t} AS m SET {set} FROM {from} \
                 WHERE m.id = l.id AND m.lease_token = l.token \
                 AND coalesce(m.dispatched_at, m.dead_at) IS NULL RETURNING id"
            )
        };
        let requeue = |now: &str| {
            // Requeued whole: a dispatched time another tool wrote on a dead letter
            // would keep it out of every claim and count.
            format!(
                "dead_at = NULL, dispatched_at = NULL, attempts = 0, available_at = {now}, \
                 lease_token = NULL"
            )
        };
        Statements {
            claim_select: claim_select(t, per_key, false),
            claim_ids_select: claim_select(t, per_key, true),
            claim_update: format!(
                "UPDATE {t} SET available_at = ?2, lease_token = ?3, \
                 attempts = min(attempts, {before_max}) + 1 \
                 WHERE seq IN (SELECT value FROM json_each(?1)) \
                 RETURNING {CLAIMED_COLUMNS}",
                before_max = i64::from(MAX_ATTEMPTS) - 1,
            ),
            dead_letter_claimed: format!(
                "UPDATE {t} AS m SET dead_at = ?2, lease_token = NULL, last_error = l.reason \
                 FROM (SELECT value ->> 0 AS seq, value ->> 1 AS reason FROM json_each(?1)) AS l \
                 WHERE m.seq = l.seq AND m.lease_token = ?3"
            ),
            complete: match config.retention() {
                Retention::Delete => format!(
                    "DELETE FROM {t} WHERE seq IN (SELECT m.seq FROM {leases} \
                     JOIN {t} AS m ON m.id = l.id \
                     WHERE m.lease_token = l.token \
                     AND coalesce(m.dispatched_at, m.dead_at) IS NULL) RETURNING id"
                ),
                Retention::Keep { .. } => settle("dispatched_at = ?2, lease_token = NULL", leases),
            },
            fail: settle(
                "available_at = CASE WHEN l.dead THEN m.available_at ELSE ?2 + l.retry_us END, \
                 dead_at = CASE WHEN l.dead THEN ?2 END, \
                 lease_token = NULL, last_error = l.error",
                "(SELECT unhex(value ->> 0) AS id, unhex(value ->> 1) AS token, \
                     value ->> 2 AS error, value ->> 3 AS dead, value ->> 4 AS retry_us \
                     FROM json_each(?1)) AS l",
            ),
            release: settle(
                "available_at = ?2, lease_token = NULL, attempts = max(m.attempts - 1, 0)",
                leases,
            ),
            dead_letters: dead_letters(t, DeadLetterOrder::Ascending),
            dead_letters_desc: dead_letters(t, DeadLetterOrder::Descending),
            admin: AdminStatements {
                retention: config.retention(),
                count_dead: format!(
                    "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL AND {DEAD_FILTER}"
                ),
                requeue_ids: format!(
                    "UPDATE {t} SET {set} WHERE dead_at IS NOT NULL \
                     AND id IN (SELECT unhex(value) FROM json_each(?1))",
                    set = requeue("?2"),
                ),
                requeue_matching: format!(
                    "UPDATE {t} SET {set} WHERE seq IN ({matching})",
                    set = requeue("?5"),
                    matching = matching_dead(t),
                ),
                discard_ids: format!(
                    "DELETE FROM {t} WHERE dead_at IS NOT NULL \
                     AND id IN (SELECT unhex(value) FROM json_each(?1))"
                ),
                discard_matching: format!("DELETE FROM {t} WHERE seq IN ({})", matching_dead(t)),
                purge_dispatched: format!(
                    "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE {PURGEABLE} \
                     ORDER BY dispatched_at LIMIT ?2)"
                ),
                count_dispatched: format!("SELECT count(*) FROM {t} WHERE {PURGEABLE}"),
            },
            stats: format!(
                "SELECT \
                 count(*) FILTER (WHERE lease_token IS NULL OR available_at <= ?1), \
                 count(*) FILTER (WHERE lease_token IS NOT NULL AND available_at > ?1), \
                 min(created_at), \
                 (SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL), \
                 (SELECT count(*) FROM {t} WHERE dispatched_at IS NOT NULL) \
                 FROM {t} WHERE {UNDELIVERED}"
            ),
        }
    }
}

/// The dead-letter filter on `?1` (destination or NULL), `?2` (dead-at cutoff or NULL)
/// and `?3` (a JSON array of hex ids, or NULL).
const DEAD_FILTER: &str = "(?1 IS NULL OR destination = ?1) AND (?2 IS NULL OR dead_at <= ?2) \
     AND (?3 IS NULL OR id IN (SELECT unhex(value) FROM json_each(?3)))";

/// Dispatched rows completed before the cutoff `?1`: what a purge deletes.
const PURGEABLE: &str = "dispatched_at IS NOT NULL AND dispatched_at < ?1";

/// The `seq` of dead letters matching the filter, lowest id first, at most `?4`.
fn matching_dead(t: &TableName) -> String {
    format!("SELECT seq FROM {t} WHERE dead_at IS NOT NULL AND {DEAD_FILTER} ORDER BY id LIMIT ?4")
}

/// A page of dead letters in `order`, past the id `?5` (if not NULL) in that order.
fn dead_letters(t: &TableName, order: DeadLetterOrder) -> String {
    let (past, direction) = match order {
        DeadLetterOrder::Ascending => ("id > ?5", ""),
        DeadLetterOrder::Descending => ("id < ?5", " DESC"),
    };
    format!(
        "SELECT id, CAST(destination AS BLOB), CAST(partition_key AS BLOB), payload, \
             CAST(content_type AS BLOB), CAST(headers AS BLOB), created_at, attempts, \
             CAST(last_error AS BLOB), dead_at \
         FROM {t} WHERE dead_at IS NOT NULL AND {DEAD_FILTER} \
         AND (?5 IS NULL OR {past}) ORDER BY id{direction} LIMIT ?4"
    )
}

/// The due rows to claim, in claim order: oldest availability, then enqueue order.
fn claim_select(t: &TableName, per_key: bool, by_ids: bool) -> String {
    let ids = if by_ids {
        "AND c.id IN (SELECT unhex(value) FROM json_each(?3))"
    } else {
        ""
    };
    // A keyed row must be the head of its key: the lowest `seq` among the key's
    // undelivered rows (dead letters do not block their key), found on `<table>_key`.
    let key_order = if per_key {
        format!(
            "AND (c.partition_key IS NULL OR c.seq = (SELECT min(e.seq) FROM {t} AS e \
             WHERE e.partition_key = c.partition_key \
             AND e.dispatched_at IS NULL AND e.dead_at IS NULL))"
        )
    } else {
        String::new()
    };
    format!(
        "SELECT c.seq, c.available_at FROM {t} AS c \
         WHERE c.dispatched_at IS NULL AND c.dead_at IS NULL AND c.available_at <= ?2 \
         {ids} {key_order} ORDER BY c.available_at, c.seq LIMIT ?1"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn statements(config: &SqliteOutboxConfig) -> Statements {
        Statements::new(&config.table_name().unwrap(), config)
    }

    #[test]
    fn claims_order_by_due_then_seq_on_the_due_index() {
        let s = statements(&SqliteOutboxConfig::default().with_table("t"));
        assert!(s
            .claim_select
            .contains("WHERE c.dispatched_at IS NULL AND c.dead_at IS NULL AND"));
        assert!(s
            .claim_select
            .ends_with("ORDER BY c.available_at, c.seq LIMIT ?1"));
        assert!(!s.claim_select.contains("partition_key"));
        assert!(!s.claim_select.contains("?3"));
        assert!(s.claim_ids_select.contains("json_each(?3)"));
        assert!(s
            .claim_update
            .contains("attempts = min(attempts, 2147483646) + 1"));
    }

    #[test]
    fn per_key_claims_take_the_head_of_undelivered_rows_only() {
        let s = statements(
            &SqliteOutboxConfig::default()
                .with_table("t")
                .with_ordering(KeyOrder::PerKey),
        );
        for sql in [&s.claim_select, &s.claim_ids_select] {
            assert!(
                sql.contains(
                    "c.seq = (SELECT min(e.seq) FROM \"t\" AS e \
                     WHERE e.partition_key = c.partition_key \
                     AND e.dispatched_at IS NULL AND e.dead_at IS NULL)"
                ),
                "{sql}"
            );
        }
    }

    #[test]
    fn settles_are_fenced_and_skip_the_partial_indexes() {
        let keep = Retention::Keep {
            window: Duration::from_secs(1),
        };
        let s = statements(&SqliteOutboxConfig::default().with_table("t"));
        let k = statements(
            &SqliteOutboxConfig::default()
                .with_table("t")
                .with_retention(keep),
        );
        for sql in [&s.complete, &k.complete, &s.fail, &s.release] {
            assert!(sql.contains("m.lease_token = l.token"), "{sql}");
            assert!(
                sql.contains("coalesce(m.dispatched_at, m.dead_at) IS NULL"),
                "{sql}"
            );
            assert!(sql.contains("json_each(?1)"), "{sql}");
        }
        assert!(s.complete.starts_with("DELETE FROM \"t\""));
        assert!(k
            .complete
            .contains("SET dispatched_at = ?2, lease_token = NULL"));
        assert!(s.dead_letter_claimed.contains("m.lease_token = ?3"));
        assert!(s.release.contains("attempts = max(m.attempts - 1, 0)"));
    }

    #[test]
    fn admin_statements_touch_dead_letters_only_and_are_bounded() {
        let s = statements(&SqliteOutboxConfig::default().with_table("t"));
        for sql in [
            &s.admin.requeue_ids,
            &s.admin.requeue_matching,
            &s.admin.discard_ids,
            &s.admin.discard_matching,
        ] {
            assert!(sql.contains("dead_at IS NOT NULL"), "{sql}");
        }
        for sql in [&s.admin.requeue_matching, &s.admin.discard_matching] {
            assert!(sql.contains("ORDER BY id LIMIT ?4"), "{sql}");
        }
        assert!(s.admin.requeue_matching.contains("available_at = ?5"));
        assert!(s.admin.purge_dispatched.contains("LIMIT ?2"));
        assert!(s.admin.purge_dispatched.contains(PURGEABLE));
        assert!(
            s.admin
                .count_dispatched
                .ends_with(&format!("WHERE {PURGEABLE}")),
            "the dry run counts what the purge deletes"
        );
        assert!(s
            .dead_letters
            .ends_with("AND (?5 IS NULL OR id > ?5) ORDER BY id LIMIT ?4"));
        assert!(s
            .dead_letters_desc
            .ends_with("AND (?5 IS NULL OR id < ?5) ORDER BY id DESC LIMIT ?4"));
        for sql in [
            &s.dead_letters,
            &s.dead_letters_desc,
            &s.admin.count_dead,
            &s.admin.requeue_matching,
            &s.admin.discard_matching,
        ] {
            assert!(
                sql.contains(DEAD_FILTER),
                "every filter takes the ids: {sql}"
            );
        }
    }
}
