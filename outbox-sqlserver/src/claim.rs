//! The claim statements: which rows a claim reads, which it locks, and the indexes
//! every read is pinned to.
//!
//! # Shapes
//!
//! - **Unordered** ([`KeyOrder::Unordered`]): one pass. An updatable CTE reads the due
//!   rows oldest first from `<table>_due`, pinned with `INDEX(..), FORCESEEK`, `WITH
//!   (UPDLOCK, READPAST, ROWLOCK)`, and the `UPDATE` stamps them. Every row the seek
//!   reads is due and undelivered (the index's filter and the seek on `available_at`
//!   say so), so the update locks fall on the `TOP (n)` rows the claim takes and on
//!   nothing else.
//! - **Per key** ([`KeyOrder::PerKey`]): two passes in one statement.
//!   1. *Heads, without update locks.* A CTE reads due rows from `<table>_due` (pinned,
//!      `WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)`: shared locks released row by row, locked
//!      rows skipped) and keeps a keyed row only if it is the head of its key, the
//!      lowest `seq` among the key's undelivered rows, read from `<table>_key` (pinned,
//!      `WITH (READCOMMITTEDLOCK)`). Rows behind an in-flight head are read and passed
//!      over, never locked beyond the moment of the read.
//!   2. *Lock the heads.* The `UPDATE` joins the heads to the table on the primary key
//!      (pinned to it, `WITH (UPDLOCK, READPAST, ROWLOCK)`) and checks again, under the
//!      update lock, that each is still due and undelivered: a head another claimer
//!      took between the passes is skipped (held) or fails the check (committed).
//! - **By ids** (`claim_ids`): the ids travel as one JSON array (`OPENJSON`, one
//!   parameter and one plan whatever their number) joined to the table on the primary
//!   key; per key, through the same two passes.
//!
//! # Per-key order and `READ_COMMITTED_SNAPSHOT`
//!
//! The head probe reads with `READCOMMITTEDLOCK`, a locking read whatever
//! `READ_COMMITTED_SNAPSHOT` says, so the two settings behave the same:
//!
//! - A row of the key that another transaction inserted and has not committed holds
//!   an exclusive lock on its `<table>_key` entry: the probe waits for that transaction
//!   (at most the session's `LOCK_TIMEOUT`, then error 1222, a retryable
//!   [`Contention`](outbox_core::ErrorKind::Contention)). Committed, it is the head and
//!   the later row waits its turn; rolled back, the later row is the head. A row
//!   versioned read (the default under `READ_COMMITTED_SNAPSHOT` on) would not see the
//!   uncommitted row and would let the later one out first.
//! - A row another claim is leasing keeps its `<table>_key` entry unchanged (the lease
//!   columns are not in that index), so the probe does not wait for claims; it finds
//!   that row as the head, and the rows behind it are passed over.
//! - A settle that removes the head from `<table>_key` (complete, dead-letter) holds
//!   that entry only for its own autocommit statement; the probe waits that long.
//!
//! The wait applies only when a candidate's key has an uncommitted row *earlier* than a
//! committed one: two transactions enqueueing one key, the later committing first.

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::KeyOrder;

use crate::ident::QualifiedName;
use crate::schema::{index, index_hint};
use crate::sql::{after, limit_param, unix_us, Binder, Param, Stmt, NOW};

/// The locks of every read that picks rows to change: update locks (so two claimers
/// never take one row), skipping rows others have locked instead of waiting, at row
/// granularity.
pub(crate) const UPDATE_LOCKS: &str = "UPDLOCK, READPAST, ROWLOCK";

/// The locks of a per-key claim's first pass: a locking read (whatever
/// `READ_COMMITTED_SNAPSHOT` says, and the form in which SQL Server accepts `READPAST`
/// under it), shared locks released as the scan moves on, locked rows skipped. Row
/// locks: `READPAST` skips locked rows but waits on locked pages, so a scan must not
/// take page locks.
pub(crate) const HEAD_SCAN_LOCKS: &str = "READCOMMITTEDLOCK, READPAST, ROWLOCK";

/// The lock of the per-key head probe: a locking read that waits for an uncommitted
/// earlier row of the key rather than skip it.
pub(crate) const HEAD_PROBE_LOCKS: &str = "READCOMMITTEDLOCK";

/// `WITH (INDEX(<index>), FORCESEEK, <locks>)`: the read pinned to a seek on `suffix`'s
/// index of `t`, so no plan (stale statistics, a large kept history) can turn it into a
/// scan that locks every row it passes.
pub(crate) fn pinned(t: &QualifiedName, suffix: &str, locks: &str) -> String {
    format!("WITH ({}, FORCESEEK, {locks})", index_hint(t, suffix))
}

/// The message columns a claim returns, from `OUTPUT`.
fn claimed_columns() -> String {
    format!(
        "INSERTED.id, INSERTED.destination, INSERTED.partition_key, INSERTED.payload, \
         INSERTED.content_type, INSERTED.headers, {created} AS created_us, \
         INSERTED.attempts, INSERTED.last_error, {lease} AS lease_us, {due} AS due_us, \
         INSERTED.seq",
        created = unix_us("INSERTED.created_at"),
        lease = unix_us("INSERTED.available_at"),
        due = unix_us("DELETED.available_at"),
    )
}

/// `SET` and `OUTPUT` of every claim: the lease, a fresh token, one more attempt
/// (saturating at [`MAX_ATTEMPTS`]); `alias` is the updated table's.
fn stamp(alias: &str, lease: &str, token: &str) -> String {
    format!(
        "SET available_at = {expiry}, lease_token = {token}, \
         attempts = CASE WHEN {alias}.attempts >= {before_max} THEN {MAX_ATTEMPTS} \
         ELSE {alias}.attempts + 1 END OUTPUT {columns}",
        expiry = after(lease),
        before_max = MAX_ATTEMPTS - 1,
        columns = claimed_columns(),
    )
}

/// The ids of a JSON array of 32-digit hex strings (`["0190...", ...]`) as `binary(16)`.
fn json_id(alias: &str) -> String {
    format!("CONVERT(binary(16), {alias}.[value], 2)")
}

/// `ids` as the JSON array [`json_id`] reads, bound as one parameter.
fn bind_ids(b: &mut Binder, ids: &[[u8; 16]]) -> String {
    let hex: Vec<String> = ids
        .iter()
        .map(|id| uuid::Uuid::from_bytes(*id).simple().to_string())
        .collect();
    b.bind(Param::Text(Some(serde_json::Value::from(hex).to_string())))
}

/// The per-key head probe of candidate `c`: true when `c` is unkeyed or the lowest
/// `seq` among its key's undelivered rows (dead letters do not block their key). It
/// states `<table>_key`'s whole filter, `partition_key IS NOT NULL` included, so the
/// pinned index matches.
fn is_head(t: &QualifiedName) -> String {
    format!(
        "(c.partition_key IS NULL OR c.seq = (SELECT TOP (1) e.seq FROM {t} AS e {hints} \
         WHERE e.partition_key = c.partition_key AND e.dispatched_at IS NULL \
         AND e.dead_at IS NULL AND e.partition_key IS NOT NULL ORDER BY e.seq))",
        hints = pinned(t, index::KEY, HEAD_PROBE_LOCKS),
    )
}

/// A claim: up to `limit` due rows (only `ids` when given), leased for `lease_us` under
/// `token`, in one statement of the shape the module describes for `ordering`.
pub(crate) fn claim(
    t: &QualifiedName,
    ordering: KeyOrder,
    limit: usize,
    lease_us: i64,
    token: [u8; 16],
    ids: Option<&[[u8; 16]]>,
) -> Stmt {
    let mut b = Binder::default();
    // `<table>_due`'s filter, verbatim, and the seek on the due time.
    let due = format!("c.dispatched_at IS NULL AND c.dead_at IS NULL AND c.available_at <= {NOW}");
    let sql = match (ordering, ids) {
        (KeyOrder::Unordered, None) => {
            let top = b.bind(Param::I64(limit_param(limit)));
            let lease = b.bind(Param::I64(lease_us));
            let token = b.bind_id(token);
            format!(
                "WITH due AS (SELECT TOP ({top}) c.* FROM {t} AS c {hints} \
                 WHERE {due} ORDER BY c.available_at, c.seq) UPDATE due {stamp};",
                hints = pinned(t, index::DUE, UPDATE_LOCKS),
                stamp = stamp("due", &lease, &token),
            )
        }
        (KeyOrder::Unordered, Some(ids)) => {
            let lease = b.bind(Param::I64(lease_us));
            let token = b.bind_id(token);
            let json = bind_ids(&mut b, ids);
            format!(
                "UPDATE c {stamp} FROM {t} AS c {hints} \
                 INNER JOIN OPENJSON({json}) AS j ON c.id = {id} WHERE {due};",
                stamp = stamp("c", &lease, &token),
                hints = pinned(t, index::PK, UPDATE_LOCKS),
                id = json_id("j"),
            )
        }
        (KeyOrder::PerKey, ids) => {
            let top = b.bind(Param::I64(limit_param(limit)));
            let lease = b.bind(Param::I64(lease_us));
            let token = b.bind_id(token);
            let source = match ids {
                None => format!("{t} AS c {}", pinned(t, index::DUE, HEAD_SCAN_LOCKS)),
                Some(ids) => format!(
                    "OPENJSON({json}) AS j INNER JOIN {t} AS c {hints} ON c.id = {id}",
                    json = bind_ids(&mut b, ids),
                    hints = pinned(t, index::PK, HEAD_SCAN_LOCKS),
                    id = json_id("j"),
                ),
            };
            format!(
                "WITH heads AS (SELECT TOP ({top}) c.id FROM {source} \
                 WHERE {due} AND {head} ORDER BY c.available_at, c.seq) \
                 UPDATE m {stamp} FROM {t} AS m {hints} INNER JOIN heads AS h ON m.id = h.id \
                 WHERE COALESCE(m.dispatched_at, m.dead_at) IS NULL \
                 AND m.available_at <= {NOW};",
                head = is_head(t),
                stamp = stamp("m", &lease, &token),
                hints = pinned(t, index::PK, UPDATE_LOCKS),
            )
        }
    };
    b.finish(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_travel_as_one_json_array_of_hex() {
        let mut b = Binder::default();
        let mut id = [0u8; 16];
        id[0] = 0x01;
        id[15] = 0xab;
        let p = bind_ids(&mut b, &[id, [0xff; 16]]);
        assert_eq!(p, "@P1");
        let stmt = b.finish(String::new());
        assert_eq!(
            stmt.params,
            vec![Param::Text(Some(format!(
                "[\"010000000000000000000000000000ab\",\"{}\"]",
                "ff".repeat(16)
            )))]
        );
    }
}
