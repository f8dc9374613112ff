//! The statements a [`MySqlOutbox`](crate::MySqlOutbox) runs, built once from its
//! validated name and config. Only a [`QualifiedName`] is formatted into the text;
//! every value is a bound parameter.
//!
//! # Access paths
//!
//! - The **claim** reads `<table>_due` (`FORCE INDEX`) in its order, locking with
//!   `FOR UPDATE SKIP LOCKED` at READ COMMITTED, so it never waits and takes no gap
//!   locks; a **claim of listed ids** reads them through the primary key.
//! - Everything that names ids (the claim's lease stamp, settles, renewals, the
//!   dead-lettering of poison rows) reaches rows through `PRIMARY` (`FORCE INDEX`), so
//!   it can never become a locking range scan of a secondary index. Id lists are
//!   `IN (?, ...)` lists padded to a power of two by repeating the last id, so a
//!   connection prepares at most a few shapes of each statement; a settle's lock and
//!   its complete, rows with values (fail, dead-lettering) and the admin's id lists are
//!   one JSON array read with `JSON_TABLE`, joined first (`STRAIGHT_JOIN`). (An `IN`
//!   list naming much of a small table is planned as a scan, and a locking scan, or a
//!   `DELETE`'s, waits on every row others hold.)
//!
//! [`json_hex`] writes those arrays.
//! - Admin statements read `<table>_dead` (dead letters, in id order) and
//!   `<table>_dispatched` (purges). MySQL refuses `LIMIT` in an `IN` subquery and a
//!   subquery on the table being changed, so bounded changes join a derived table;
//!   purges lock their rows first ([`purge_locked`](crate::admin::purge_locked)).

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{DeadLetterOrder, KeyOrder, Retention};
use outbox_sqlx::AdminStatements;

use crate::config::{MySqlOutboxConfig, QualifiedName};

/// The storage clock: UTC, microseconds, fixed for the statement.
pub(crate) const NOW: &str = "UTC_TIMESTAMP(6)";

/// The message columns, as the claim and dead-letter pages read them. A time that is
/// not a date (`0000-00-00`, written with `NO_ZERO_DATE` off) reads as `NULL` through
/// `+ INTERVAL 0 SECOND`, so the row is poison instead of failing the statement.
pub(crate) const COLUMNS: &str = "id, destination, partition_key, payload, content_type, headers, \
                       created_at + INTERVAL 0 SECOND AS created_at, last_error";

/// Prebuilt statement text; `{ids}` marks where an id list goes ([`with_ids`]).
/// Parameters: `claim` lease µs, limit (`claim_ids`: lease µs, ids, limit); `lease`
/// expiry, token, ids; `lock` lease µs (0 but for renewals), ids as a JSON array of
/// hex; `complete` the same JSON array; `release` ids; `renew` expiry, ids; `fail` one JSON array of `[id, token, error,
/// dead, retry µs]` (id and token in hex), fenced by token; `release_claim` token, ids.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: String,
    pub(crate) claim_ids: String,
    pub(crate) lease: String,
    pub(crate) lock: String,
    pub(crate) complete: String,
    pub(crate) release: String,
    pub(crate) renew: String,
    pub(crate) fail: String,
    pub(crate) release_claim: String,
    pub(crate) stats: String,
    /// The second statement of a purge: the ids `admin.purge_dispatched` locked.
    pub(crate) purge_delete: String,
    /// Dead-letter pages by order and cursor, see [`Statements::dead_letters`].
    pages: [String; 4],
    pub(crate) admin: AdminStatements,
}

/// `sql` with its `{ids}` replaced by `n` placeholders rounded up to a power of two;
/// bind [`padded`] ids there.
pub(crate) fn with_ids(sql: &str, n: usize) -> String {
    let list = vec!["?"; n.max(1).next_power_of_two()].join(", ");
    sql.replace("{ids}", &list)
}

/// Ids as the JSON array of 32-digit hex strings the `JSON_TABLE` statements read.
pub(crate) fn json_hex(ids: impl IntoIterator<Item = uuid::Uuid>) -> String {
    let hex: Vec<String> = ids.into_iter().map(|id| id.simple().to_string()).collect();
    serde_json::Value::from(hex).to_string()
}

/// `items` repeated at the end to fill the list of [`with_ids`].
pub(crate) fn padded<T: Copy>(items: &[T]) -> impl Iterator<Item = T> + '_ {
    let n = items.len().max(1).next_power_of_two();
    (0..n).filter_map(move |i| items.get(i.min(items.len().saturating_sub(1))).copied())
}

/// `now` minus `param` µs, stopping at the Unix epoch instead of overflowing.
pub(crate) fn cutoff(param: &str) -> String {
    format!(
        "{NOW} - INTERVAL LEAST({param}, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {NOW})) \
         MICROSECOND"
    )
}

/// Ids bound as one JSON array of hex strings, as a table `j` of hex `h`.
const JSON_TABLE: &str = "JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j";
/// [`JSON_TABLE`] as a subquery of ids.
const JSON_IDS: &str =
    "SELECT UNHEX(j.h) FROM JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$')) AS j";

/// The dead-letter filter: destination, destination, age, age, ids, ids (NULL: any).
fn dead_filter() -> String {
    format!(
        "(? IS NULL OR destination = ?) AND (? IS NULL OR dead_at <= {cut}) \
         AND (? IS NULL OR id IN ({JSON_IDS}))",
        cut = cutoff("?"),
    )
}

impl Statements {
    pub(crate) fn new(t: &QualifiedName, config: &MySqlOutboxConfig) -> Self {
        let ix = |suffix: &str| t.quoted_derived(suffix);
        let head = if config.ordering() == KeyOrder::PerKey {
            format!(
                " AND (c.partition_key IS NULL OR c.seq = (SELECT e.seq FROM {t} AS e \
                 FORCE INDEX ({key}) WHERE e.key_head = c.partition_key ORDER BY e.seq LIMIT 1))",
                key = ix("key")
            )
        } else {
            String::new()
        };
        let claim = |index: &str, ids: &str| {
            format!(
                "SELECT {COLUMNS}, IF(attempts < {MAX_ATTEMPTS}, attempts + 1, attempts) AS \
                 attempts, due_at + INTERVAL 0 SECOND AS due_time, seq, \
                 {NOW} + INTERVAL ? MICROSECOND AS lease_expires_at FROM {t} AS c FORCE INDEX ({index}) WHERE {ids}due_at <= {NOW}{head} \
                 ORDER BY due_at, seq LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        };
        let by_id = |set: &str| format!("UPDATE {t} FORCE INDEX (PRIMARY) SET {set} WHERE ");
        let release = "available_at = UTC_TIMESTAMP(6), lease_token = NULL, \
                       attempts = GREATEST(attempts - 1, 0)";
        let requeue = "dead_at = NULL, dispatched_at = NULL, attempts = 0, \
                       available_at = UTC_TIMESTAMP(6), lease_token = NULL";
        let dead = ix("dead");
        // The chosen ids first, then the table by primary key: joined the other way
        // round, the optimizer may scan the table and wait on rows a relay holds.
        let matching = format!(
            "(SELECT id FROM {t} FORCE INDEX ({dead}) WHERE dead_flag = 1 AND {f} \
             ORDER BY id LIMIT ?) AS x STRAIGHT_JOIN {t} FORCE INDEX (PRIMARY) ON {t}.id = x.id",
            f = dead_filter()
        );
        // Joined, not `IN (JSON_TABLE)`: MariaDB < 11.1 has no semijoin for a
        // single-table UPDATE/DELETE and scans the table with a dependent subquery.
        // `STRAIGHT_JOIN`: the ids first, or a small table is scanned (and locked). A
        // settle's lock and complete read their ids this way too: an `IN (...)` list naming
        // much of a small table is planned as a scan, which waits on every row others hold.
        let by_json =
            format!("{JSON_TABLE} STRAIGHT_JOIN {t} FORCE INDEX (PRIMARY) ON {t}.id = UNHEX(j.h)");
        // The listed ids that are dead letters, found through `<table>_dead` (the rows
        // a relay holds are never dead, so never read), then the table by primary key:
        // reached by primary key first, a listed row a relay holds would be waited on.
        // `DISTINCT` keeps the derived table from being merged.
        let listed_dead = format!(
            "(SELECT DISTINCT d.id FROM {JSON_TABLE} STRAIGHT_JOIN {t} AS d FORCE INDEX ({dead}) \
             ON d.dead_flag = 1 AND d.id = UNHEX(j.h)) AS x \
             STRAIGHT_JOIN {t} FORCE INDEX (PRIMARY) ON {t}.id = x.id"
        );
        let dispatched = format!(
            "FROM {t} FORCE INDEX ({index}) WHERE dispatched_at < {cut}",
            index = ix("dispatched"),
            cut = cutoff("?")
        );
        let page = |direction: &str, after: &str| {
            format!(
                "SELECT {COLUMNS}, attempts, dead_at + INTERVAL 0 SECOND AS dead_time \
                 FROM {t} FORCE INDEX ({dead}) WHERE dead_flag = 1 AND {f}{after} ORDER BY id{direction} LIMIT ?",
                f = dead_filter()
            )
        };
        Statements {
            claim: claim(&ix("due"), ""),
            claim_ids: claim("PRIMARY", "id IN ({ids}) AND "),
            lease: by_id(&format!(
                "available_at = ?, lease_token = ?, \
                 attempts = IF(attempts < {MAX_ATTEMPTS}, attempts + 1, attempts)"
            )) + "id IN ({ids})",
            lock: format!(
                "SELECT {t}.id, {t}.lease_token, {t}.due_at IS NOT NULL AS undelivered, \
                 {NOW} + INTERVAL ? MICROSECOND AS expiry FROM {by_json} \
                 ORDER BY {t}.id FOR UPDATE"
            ),
            complete: match config.retention() {
                Retention::Delete => format!("DELETE {t} FROM {by_json}"),
                Retention::Keep { .. } => format!(
                    "UPDATE {by_json} SET dispatched_at = {NOW}, lease_token = NULL \
                     WHERE {t}.due_at IS NOT NULL"
                ),
            },
            release: by_id(release) + "id IN ({ids})",
            renew: by_id("available_at = ?") + "id IN ({ids})",
            fail: format!(
                "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (h CHAR(32) PATH '$[0]', k CHAR(32) PATH \
                 '$[1]', e TEXT CHARACTER SET utf8mb4 PATH '$[2]', d INT PATH '$[3]', r BIGINT \
                 PATH '$[4]')) AS j STRAIGHT_JOIN {t} FORCE INDEX (PRIMARY) ON {t}.id = UNHEX(j.h) \
                 SET lease_token = NULL, last_error = j.e, dead_at = IF(j.d, {NOW}, NULL), \
                 available_at = IF(j.d, available_at, {NOW} + INTERVAL j.r MICROSECOND) \
                 WHERE {t}.lease_token = UNHEX(j.k) AND {t}.due_at IS NOT NULL"
            ),
            release_claim: by_id(release)
                + "lease_token = ? AND due_at IS NOT NULL AND id IN ({ids})",
            stats: format!(
                "SELECT COUNT(IF(lease_token IS NULL OR available_at <= {NOW}, 1, NULL)) AS pending, \
                 COUNT(IF(lease_token IS NOT NULL AND available_at > {NOW}, 1, NULL)) AS in_flight, \
                 TIMESTAMPDIFF(MICROSECOND, MIN(created_at), {NOW}) AS oldest_us, \
                 (SELECT COUNT(*) FROM {t} FORCE INDEX ({dead}) WHERE dead_flag = 1) AS dead, \
                 (SELECT COUNT(*) FROM {t} FORCE INDEX ({index}) WHERE dispatched_at IS NOT NULL) \
                 AS dispatched FROM {t} FORCE INDEX ({due}) WHERE due_at IS NOT NULL",
                index = ix("dispatched"),
                due = ix("due"),
            ),
            pages: [
                page("", ""),
                page("", " AND id > ?"),
                page(" DESC", ""),
                page(" DESC", " AND id < ?"),
            ],
            purge_delete: format!("DELETE {t} FROM {by_json}"),
            admin: AdminStatements {
                retention: config.retention(),
                count_dead: format!(
                    "SELECT COUNT(*) FROM {t} FORCE INDEX ({dead}) WHERE dead_flag = 1 AND {f}",
                    f = dead_filter()
                ),
                requeue_ids: format!("UPDATE {listed_dead} SET {requeue} WHERE {t}.dead_flag = 1"),
                requeue_matching: format!("UPDATE {matching} SET {requeue}"),
                discard_ids: format!("DELETE {t} FROM {listed_dead} WHERE {t}.dead_flag = 1"),
                discard_matching: format!("DELETE {t} FROM {matching}"),
                purge_dispatched: format!(
                    "SELECT JSON_QUOTE(HEX(id)) {dispatched} ORDER BY dispatched_at LIMIT ? \
                     FOR UPDATE SKIP LOCKED"
                ),
                count_dispatched: format!("SELECT COUNT(*) {dispatched}"),
            },
        }
    }

    /// A page of dead letters: the filter, the cursor id with `after`, the limit.
    pub(crate) fn dead_letters(&self, order: DeadLetterOrder, after: bool) -> &str {
        let descending = order == DeadLetterOrder::Descending;
        &self.pages[usize::from(descending) * 2 + usize::from(after)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lists_are_padded_to_powers_of_two() {
        assert_eq!(with_ids("a IN ({ids})", 3), "a IN (?, ?, ?, ?)");
        assert_eq!(with_ids("({ids})", 1), "(?)");
        assert_eq!(padded(&[1, 2, 3]).collect::<Vec<_>>(), [1, 2, 3, 3]);
        assert_eq!(padded(&[5]).collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn relay_statements_name_their_index() {
        let t = QualifiedName::new("s", "t").unwrap();
        let sql = Statements::new(
            &t,
            &MySqlOutboxConfig::default().with_ordering(KeyOrder::PerKey),
        );
        assert!(sql.claim.contains("FORCE INDEX (`t_due`)"), "{}", sql.claim);
        assert!(sql.claim.contains("FORCE INDEX (`t_key`)"), "{}", sql.claim);
        assert!(sql.claim.ends_with("FOR UPDATE SKIP LOCKED"));
        for text in [
            &sql.claim_ids,
            &sql.lease,
            &sql.lock,
            &sql.complete,
            &sql.release,
            &sql.fail,
        ] {
            assert!(text.contains("FORCE INDEX (PRIMARY)"), "{text}");
        }
    }
}
