//! The statements a [`PgOutbox`](crate::PgOutbox) runs, built once from its validated
//! name and config, and the conversions of values for binding.
//!
//! Only a [`QualifiedName`] is formatted into the text; every value is a bound
//! parameter. Batch statements take parallel arrays and `unnest` them, so a call is one
//! round trip however many messages it carries.
//!
//! # Access paths
//!
//! - The **claim** reads the partial `<table>_due` index: it states the undelivered
//!   predicate exactly as the index does ([`UNDELIVERED`]). It reads two ranges of it:
//!   the due rows from the bottom, and from the top the rows whose `available_at` lies
//!   past what chrono can hold (one probe that finds nothing in a healthy table), so
//!   that such a row is dead-lettered instead of never coming due.
//! - Under per-key order, the claim also probes the partial `<table>_key` index for the
//!   head of each keyed candidate's key. No other statement reads that index, so only
//!   a per-key outbox installs it ([`crate::schema`]), and the enqueues and claims of
//!   a table installed unordered do not pay for maintaining it.
//! - **Settles** (complete, fail, release, dead-lettering what a claim could not
//!   deliver, renewals) reach rows by primary key. They join the bound ids (sorted, so
//!   rows are locked in id order) on `id` and state "undelivered" as
//!   `coalesce(dispatched_at, dead_at) IS NULL`, which no partial index predicate
//!   matches, so the due index is never a candidate (written like the claim, the
//!   planner chose a nested loop over the whole due index per settled id on a table
//!   without statistics: 3.4 s for a 100-row complete over 57,000 undelivered rows).
//!   **Claims of listed ids** state it the same way, so they too find their rows
//!   through the primary key instead of walking the due index in its order.
//! - **Complete and claim** (what a busy relay sends between batches,
//!   [`OutboxStore::settle_and_claim`](outbox_core::OutboxStore::settle_and_claim)) is
//!   one statement: the complete as a data-modifying CTE reaching rows by primary key,
//!   the claim as above minus the ids being settled.
//! - Every statement a relay sends is **prepared** once per connection and runs on the
//!   relay's own connections ([`crate::connect`]), whose sessions price out sequential
//!   and bitmap scans, hash and merge joins and sorts. With those gone, the shapes above
//!   leave each statement one plan, the intended one, for custom and generic plans
//!   alike, made on an empty table or a grown one without statistics. (Prepared on
//!   ordinary sessions, a generic plan made while the table held ten rows completed
//!   100 rows of 100,000 in 2.7 s, a sequential scan joined to the ids; planned per
//!   call instead, every batch paid a second round trip and a plan.)
//! - **Enqueue** reads nothing: `ON CONFLICT (id) DO NOTHING` finds stored ids through
//!   the primary key's uniqueness check.
//! - **Admin** statements on dead letters read the `<table>_dead` index (or the primary
//!   key for explicit ids); purges and counts of dispatched history read
//!   `<table>_dispatched`. Stats count dead and dispatched rows through those two
//!   indexes in every configuration (under `Retention::Delete` the dispatched one is
//!   always empty, so its count costs one probe).

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{DeadLetterOrder, KeyOrder, Retention};
use outbox_sqlx::AdminStatements;

use crate::config::PgOutboxConfig;
use crate::ident::QualifiedName;
use crate::schema::UNDELIVERED;

/// Earliest and latest timestamps returned as such: outside them (`-infinity`,
/// `infinity`, years chrono cannot hold), a claimed row is dead-lettered and a listed
/// one shows the bound.
const MIN_TIME: &str = "'0001-01-01 00:00:00+00'::timestamptz";
const MAX_TIME: &str = "'9999-12-31 23:59:59.999999+00'::timestamptz";
/// The range, as written in a dead letter's reason.
pub(crate) const TIME_RANGE: &str = "0001-01-01..9999-12-31 UTC";

/// Prebuilt statement text.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `$1..$7` message arrays, `$8` channel when notifying; returns the ids inserted
    /// (fewer than given when some were already stored).
    pub(crate) enqueue: String,
    /// `$1` ids: take back rows this transaction just inserted.
    pub(crate) unenqueue: String,
    /// `$1..$9` dead letters' arrays (id, destination, key, payload, content type,
    /// headers, created at, attempts, last error): store them dead, skipping stored ids.
    pub(crate) store_dead: String,
    /// `$1` limit, `$2` lease µs, `$3` token.
    pub(crate) claim: String,
    /// As `claim`, plus `$4` ids.
    pub(crate) claim_ids: String,
    /// `$1..$3` as `claim`, `$4` ids and `$5` tokens to complete (id order), `$6` ids
    /// the claim must not return: one statement completing a batch and claiming the
    /// next. Returns at least one row: `completed` (the ids completed) on one row,
    /// NULL on the others (on every row it cost 16 MB per batch of 1,000), and the
    /// claimed rows' columns, NULL when nothing was claimed.
    pub(crate) complete_and_claim: String,
    /// `$1` ids, `$2` reasons, `$3` token: dead-letter claimed rows that cannot be
    /// delivered (a settle).
    pub(crate) dead_letter_claimed: String,
    /// `$1` token, `$2` ids: undo a whole claim (lease, attempt) after it could not be
    /// returned (a settle).
    pub(crate) release_claim: String,
    /// `$1` ids, `$2` tokens.
    pub(crate) complete: String,
    /// `$1` ids, `$2` tokens, `$3` errors, `$4` dead flags, `$5` retry delays µs.
    pub(crate) fail: String,
    /// `$1` ids, `$2` tokens.
    pub(crate) release: String,
    /// `$1` ids, `$2` tokens, `$3` lease µs: extend held leases; returns `id` and the
    /// new `expires_at` of each lease extended (a settle).
    pub(crate) renew: String,
    /// Pages of dead letters, by order and cursor: see [`Statements::dead_letters`].
    dead_letter_pages: [String; 4],
    /// Count, requeue, discard and purge: [`AdminStatements`] gives their parameters,
    /// bound as the outbox's [`SqlxAdmin`](outbox_sqlx::SqlxAdmin) impl binds them.
    pub(crate) admin: AdminStatements,
    /// No parameters.
    pub(crate) stats: String,
}

impl Statements {
    /// A page of dead letters in `order`: `$1..$3` the filter ([`dead_filter`]), `$4`
    /// limit, and with `after`, `$5` the id the page starts after.
    pub(crate) fn dead_letters(&self, order: DeadLetterOrder, after: bool) -> &str {
        let descending = order == DeadLetterOrder::Descending;
        &self.dead_letter_pages[usize::from(descending) * 2 + usize::from(after)]
    }

    pub(crate) fn new(t: &QualifiedName, config: &PgOutboxConfig) -> Self {
        let per_key = config.ordering() == KeyOrder::PerKey;
        let settle = |set: &str, from: &str| {
            format!(
                "UPDATE {t} AS m SET {set} FROM {from} \
                 WHERE {by_key} AND m.lease_token = l.token RETURNING m.id",
                by_key = by_primary_key("m", "l"),
            )
        };
        let leases = "unnest($1::uuid[], $2::uuid[]) AS l(id, token)";
        // Requeued whole: a dispatched time another tool wrote on a dead letter would keep
        // it out of every claim and count.
        let requeue = "dead_at = NULL, dispatched_at = NULL, attempts = 0, \
                       available_at = now(), lease_token = NULL";
        Statements {
            enqueue: enqueue(t, config.notify_channel().is_some()),
            unenqueue: format!("DELETE FROM {t} WHERE id = ANY($1::uuid[])"),
            store_dead: format!(
                "INSERT INTO {t} (id, destination, partition_key, payload, content_type, \
                 headers, created_at, available_at, attempts, last_error, dead_at) \
                 SELECT n.id, n.destination, n.partition_key, n.payload, n.content_type, \
                     n.headers, n.created_at, now(), n.attempts, n.last_error, now() \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[], \
                     $6::jsonb[], $7::timestamptz[], $8::int4[], $9::text[]) \
                     AS n(id, destination, partition_key, payload, content_type, headers, \
                          created_at, attempts, last_error) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            claim: claim(t, per_key, Claim::Due),
            claim_ids: claim(t, per_key, Claim::Ids),
            complete_and_claim: complete_and_claim(t, per_key, config.retention()),
            dead_letter_claimed: format!(
                "UPDATE {t} AS m SET dead_at = now(), lease_token = NULL, last_error = l.error \
                 FROM unnest($1::uuid[], $2::text[]) AS l(id, error) \
                 WHERE {by_key} AND m.lease_token = $3::uuid",
                by_key = by_primary_key("m", "l"),
            ),
            release_claim: format!(
                "UPDATE {t} AS m SET available_at = now(), lease_token = NULL, \
                 attempts = greatest(m.attempts - 1, 0) \
                 FROM unnest($2::uuid[]) AS l(id) \
                 WHERE {by_key} AND m.lease_token = $1",
                by_key = by_primary_key("m", "l"),
            ),
            complete: complete(t, config.retention(), "$1", "$2"),
            fail: settle(
                "available_at = CASE WHEN l.dead THEN m.available_at \
                     ELSE now() + l.retry_us * interval '1 microsecond' END, \
                 dead_at = CASE WHEN l.dead THEN now() END, \
                 lease_token = NULL, last_error = l.error",
                "unnest($1::uuid[], $2::uuid[], $3::text[], $4::bool[], $5::bigint[]) \
                     AS l(id, token, error, dead, retry_us)",
            ),
            release: settle(
                "available_at = now(), lease_token = NULL, \
                 attempts = greatest(m.attempts - 1, 0)",
                leases,
            ),
            renew: format!(
                "UPDATE {t} AS m SET available_at = now() + $3 * interval '1 microsecond' \
                 FROM {leases} WHERE {by_key} AND m.lease_token = l.token \
                 RETURNING m.id, m.available_at AS expires_at",
                by_key = by_primary_key("m", "l"),
            ),
            dead_letter_pages: [
                dead_letters(t, DeadLetterOrder::Ascending, false),
                dead_letters(t, DeadLetterOrder::Ascending, true),
                dead_letters(t, DeadLetterOrder::Descending, false),
                dead_letters(t, DeadLetterOrder::Descending, true),
            ],
            admin: AdminStatements {
                retention: config.retention(),
                count_dead: format!(
                    "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL AND {filter}",
                    filter = dead_filter(),
                ),
                requeue_ids: format!(
                    "UPDATE {t} SET {requeue} WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL"
                ),
                requeue_matching: format!(
                    "UPDATE {t} SET {requeue} WHERE id IN ({})",
                    matching_dead(t)
                ),
                discard_ids: format!(
                    "DELETE FROM {t} WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL"
                ),
                discard_matching: format!("DELETE FROM {t} WHERE id IN ({})", matching_dead(t)),
                purge_dispatched: format!(
                    "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} \
                     WHERE {purgeable} \
                     ORDER BY dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
                    purgeable = purgeable("$1"),
                ),
                count_dispatched: format!(
                    "SELECT count(*) FROM {t} WHERE {purgeable}",
                    purgeable = purgeable("$1"),
                ),
            },
            stats: format!(
                "SELECT \
                 count(*) FILTER (WHERE lease_token IS NULL OR available_at <= now()) AS pending, \
                 count(*) FILTER (WHERE lease_token IS NOT NULL AND available_at > now()) \
                     AS in_flight, \
                 (extract(epoch FROM now() - min({created})) * 1000000)::bigint AS oldest_us, \
                 (SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL) AS dead, \
                 (SELECT count(*) FROM {t} WHERE dispatched_at IS NOT NULL) AS dispatched \
                 FROM {t} WHERE {UNDELIVERED}",
                created = clamp("created_at"),
            ),
        }
    }
}

// Bound-parameter conversions shared by every backend; huge ages stop at the Unix
// epoch in the statements (see [`cutoff`]).
pub(crate) use outbox_core::backend::{age_micros, limit_param, micros};

/// `predicate` (written for the bare table) with every column of `UNDELIVERED`
/// qualified by `alias`.
fn qualified(predicate: &str, alias: &str) -> String {
    predicate
        .replace("dispatched_at", &format!("{alias}.dispatched_at"))
        .replace("dead_at", &format!("{alias}.dead_at"))
}

/// Rows of `m` joining the bound ids of `l`, undelivered: written so that no partial
/// index applies and rows are found by primary key (see the module docs).
pub(crate) fn by_primary_key(m: &str, l: &str) -> String {
    format!("{m}.id = {l}.id AND coalesce({m}.dispatched_at, {m}.dead_at) IS NULL")
}

/// `now()` minus `param` microseconds, stopping at the Unix epoch rather than
/// overflowing PostgreSQL's timestamp range for huge ages.
fn cutoff(param: &str) -> String {
    format!(
        "now() - least({param}, (extract(epoch FROM now()) * 1000000)::bigint) \
         * interval '1 microsecond'"
    )
}

/// `column` held within [`MIN_TIME`]..[`MAX_TIME`], so it always decodes.
pub(crate) fn clamp(column: &str) -> String {
    format!("least(greatest({column}, {MIN_TIME}), {MAX_TIME})")
}

/// `column` clamped as `alias`, plus `alias_invalid`: the original value as text when
/// it was out of range, else NULL.
pub(crate) fn checked_time(column: &str, alias: &str) -> String {
    format!(
        "{clamped} AS {alias}, \
         CASE WHEN {column} BETWEEN {MIN_TIME} AND {MAX_TIME} THEN NULL \
             ELSE {column}::text END AS {alias}_invalid",
        clamped = clamp(column),
    )
}

/// Dead letters matching the filter parameters ([`dead_filter`]), lowest id first, at
/// most `$4`, skipping rows locked elsewhere.
fn matching_dead(t: &QualifiedName) -> String {
    format!(
        "SELECT id FROM {t} WHERE dead_at IS NOT NULL AND {filter} \
         ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED",
        filter = dead_filter(),
    )
}

/// Dispatched rows completed more than `param` microseconds ago: what a purge deletes.
fn purgeable(param: &str) -> String {
    format!(
        "dispatched_at IS NOT NULL AND dispatched_at < {}",
        cutoff(param)
    )
}

/// The dead-letter filter on `$1` (destination or NULL), `$2` (least age µs or NULL)
/// and `$3` (ids or NULL).
fn dead_filter() -> String {
    format!(
        "($1::text IS NULL OR destination = $1) \
         AND ($2::bigint IS NULL OR dead_at <= {}) \
         AND ($3::uuid[] IS NULL OR id = ANY($3::uuid[]))",
        cutoff("$2")
    )
}

/// A page of dead letters in `order`; `after` adds `$5`, the id the page starts after.
fn dead_letters(t: &QualifiedName, order: DeadLetterOrder, after: bool) -> String {
    let (past, direction) = match order {
        DeadLetterOrder::Ascending => ("AND id > $5", ""),
        DeadLetterOrder::Descending => ("AND id < $5", " DESC"),
    };
    format!(
        "SELECT id, destination, partition_key, payload, content_type, headers, \
             {created}, attempts, last_error, {dead} \
         FROM {t} WHERE dead_at IS NOT NULL AND {filter} {after} \
         ORDER BY id{direction} LIMIT $4",
        created = checked_time("created_at", "created_at"),
        dead = checked_time("dead_at", "dead_at"),
        filter = dead_filter(),
        after = if after { past } else { "" },
    )
}

/// One statement inserting the whole batch, skipping ids already stored (`ON CONFLICT
/// DO NOTHING` checks them through the primary key, waiting for a transaction that is
/// inserting the same id to end) and returning the ids it inserted. It notifies only
/// when it inserted the whole batch.
fn enqueue(t: &QualifiedName, notify: bool) -> String {
    let insert = format!(
        "INSERT INTO {t} \
         (id, destination, partition_key, payload, content_type, headers, available_at) \
         SELECT n.id, n.destination, n.partition_key, n.payload, n.content_type, n.headers, \
             now() + n.delay_us * interval '1 microsecond' \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[], \
             $6::jsonb[], $7::bigint[]) WITH ORDINALITY \
             AS n(id, destination, partition_key, payload, content_type, headers, delay_us, ord) \
         ORDER BY n.ord \
         ON CONFLICT (id) DO NOTHING RETURNING id"
    );
    let inserted = "array(SELECT id FROM inserted) AS inserted";
    if notify {
        // `notified` is read (by the count), so it runs; it has a row only when the
        // whole batch was inserted. Identical notifications of one transaction fold.
        format!(
            "WITH inserted AS ({insert}), \
             notified AS (SELECT pg_notify($8, '') \
                 WHERE (SELECT count(*) FROM inserted) = cardinality($1::uuid[])) \
             SELECT {inserted}, (SELECT count(*) FROM notified) AS notified"
        )
    } else {
        format!("WITH inserted AS ({insert}) SELECT {inserted}")
    }
}

/// The complete statement, with `ids` and `tokens` the array parameters.
fn complete(t: &QualifiedName, retention: Retention, ids: &str, tokens: &str) -> String {
    let leases = format!("unnest({ids}::uuid[], {tokens}::uuid[]) AS l(id, token)");
    let by_key = by_primary_key("m", "l");
    match retention {
        Retention::Delete => format!(
            "DELETE FROM {t} AS m USING {leases} \
             WHERE {by_key} AND m.lease_token = l.token RETURNING m.id"
        ),
        Retention::Keep { .. } => format!(
            "UPDATE {t} AS m SET dispatched_at = now(), lease_token = NULL FROM {leases} \
             WHERE {by_key} AND m.lease_token = l.token RETURNING m.id"
        ),
    }
}

/// Complete a batch and claim the next in one statement. The complete is a
/// data-modifying CTE, run to completion whether read or not; the claim runs on the
/// same snapshot, so it would still see the rows being completed: `$6` (every id the
/// call settles) keeps them out, since a lapsed lease's row is due and updating a row
/// twice in one statement is undefined. Under per-key order the snapshot also shows a
/// completed head as undelivered, so its key's next message waits for the next claim:
/// order holds, a claim later.
///
/// The complete first locks the batch's rows (in the order of the ids, which are
/// sorted), `NOWAIT`, and then writes them by `ctid`: it never waits while holding rows
/// it already wrote. A claim whose snapshot predates another relay's claim of a row
/// locks that row's newest version, fails its re-check and keeps the lock to the end of
/// its statement; a complete that waited for it could deadlock with that claim (four
/// relays did, about once in 40,000 messages, each a one-second stall until
/// `deadlock_timeout`). Refused instead (`55P03`, retryable), the relay settles again on
/// its own.
fn complete_and_claim(t: &QualifiedName, per_key: bool, retention: Retention) -> String {
    let (ctes, update) = claim_parts(t, per_key, Claim::Excluding);
    let done = match retention {
        Retention::Delete => {
            format!("DELETE FROM {t} AS m USING mine WHERE m.ctid = mine.ctid RETURNING m.id")
        }
        Retention::Keep { .. } => format!(
            "UPDATE {t} AS m SET dispatched_at = now(), lease_token = NULL FROM mine \
             WHERE m.ctid = mine.ctid RETURNING m.id"
        ),
    };
    format!(
        "WITH mine AS (SELECT m.ctid FROM {t} AS m, \
         unnest($4::uuid[], $5::uuid[]) AS l(id, token) \
         WHERE {by_key} AND m.lease_token = l.token FOR UPDATE OF m NOWAIT), \
         done AS ({done}), {ctes}, claimed AS ({update}) \
         SELECT CASE WHEN row_number() OVER () = 1 THEN d.completed END AS completed, c.* \
         FROM (SELECT array(SELECT id FROM done) AS completed) AS d \
         LEFT JOIN claimed AS c ON true",
        by_key = by_primary_key("m", "l"),
    )
}

/// Which rows a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Any due row.
    Due,
    /// Due rows among `$4` ids.
    Ids,
    /// Due rows not among `$6` ids.
    Excluding,
}

/// Select due rows (skipping locked ones), stamp the lease, return them.
fn claim(t: &QualifiedName, per_key: bool, which: Claim) -> String {
    let (ctes, update) = claim_parts(t, per_key, which);
    format!("WITH {ctes} {update}")
}

/// A claim's CTEs (without `WITH`, ending in `due`) and its `UPDATE ... RETURNING`.
pub(crate) fn claim_parts(t: &QualifiedName, per_key: bool, which: Claim) -> (String, String) {
    let ids = match which {
        Claim::Due => "",
        Claim::Ids => "AND c.id = ANY($4::uuid[])",
        // A hashed subplan: one probe per row walked. (`c.id <> ALL($6)` compared each
        // row with every settled id, 1,000 x 1,000 per batch of 1,000: 7.6 ms of a
        // claim that takes 0.7 ms this way.)
        Claim::Excluding => "AND c.id NOT IN (SELECT x FROM unnest($6::uuid[]) AS x)",
    };
    // A keyed row must be the head of its key: no undelivered row of the key has a
    // lower `seq` (dead letters do not block their key). Written as "`c.seq` is at most
    // the key's first undelivered `seq`" (which, `c` being undelivered, means equal)
    // rather than as `NOT EXISTS (... e.seq < c.seq)`: the planner can answer `ORDER BY
    // e.seq LIMIT 1` only from the `<table>_key` index, whereas it planned the
    // `NOT EXISTS` as a sequential scan when one key dominated the statistics,
    // rescanning the table once per blocked row (15 s per claim with 50,000 rows behind
    // an in-flight head). `<=` rather than `=` keeps the row estimate, and so the
    // claim's cost, low enough not to trigger JIT compilation (~25 ms per claim).
    let key_order = if per_key {
        format!(
            "AND (c.partition_key IS NULL OR c.seq <= (SELECT e.seq FROM {t} AS e \
             WHERE e.partition_key = c.partition_key AND {} ORDER BY e.seq LIMIT 1))",
            qualified(UNDELIVERED, "e")
        )
    } else {
        String::new()
    };
    // Rows are taken from two ranges of the due index: the due ones, and (the
    // `stranded` branch, one index probe that finds nothing in a healthy table) rows
    // whose `available_at` another tool set past MAX_TIME (`infinity`, a year chrono
    // cannot hold). Those would otherwise never come due, and under per-key order would
    // block their key forever; claimed, they are dead-lettered with the reason.
    // Listed ids are found by primary key: "undelivered" in the form no partial index
    // matches (as the settles write it), or, with sorts priced out on the relay's
    // connections, the due index's order would make walking it the cheapest plan.
    let undelivered = match which {
        Claim::Ids => "coalesce(c.dispatched_at, c.dead_at) IS NULL".to_owned(),
        Claim::Due | Claim::Excluding => qualified(UNDELIVERED, "c"),
    };
    let branch = |name: &str, when: &str| {
        format!(
            "{name} AS (SELECT c.ctid, c.available_at, c.seq FROM {t} AS c \
             WHERE {undelivered} AND {when} {ids} {key_order} \
             ORDER BY c.available_at, c.seq LIMIT $1 FOR UPDATE OF c SKIP LOCKED)",
        )
    };
    // The update finds the locked rows by `ctid`: with hash and merge joins and
    // sequential scans priced out on the relay's connections, a nested loop over `due`
    // with a TID scan per row is the one plan left. (On ordinary sessions a join on
    // `id`, or on `ctid` alone, became a hash join over a scan of the whole table for
    // large batches; the extra `ctid = ANY(ARRAY(...))` that once steered it away from
    // that made the nested loop rescan `due` once per row, 1,000 x 1,000 for a batch of
    // 1,000.) The row lock taken in `ready` / `stranded` keeps each `ctid` valid until
    // this statement updates it. Attempts saturate at MAX_ATTEMPTS (the row is then
    // dead-lettered) instead of overflowing `integer` and failing every claim.
    let ctes = format!(
        "{ready}, {stranded}, \
         due AS (SELECT * FROM ready UNION ALL SELECT * FROM stranded)",
        ready = branch("ready", "c.available_at <= now()"),
        stranded = branch("stranded", &format!("c.available_at > {MAX_TIME}")),
    );
    let update = format!(
        "UPDATE {t} AS m SET available_at = now() + $2 * interval '1 microsecond', \
             lease_token = $3, attempts = least(m.attempts, {before_max}) + 1 \
         FROM due WHERE m.ctid = due.ctid \
         RETURNING m.id, m.destination, m.partition_key, m.payload, m.content_type, \
             m.headers, {created}, m.attempts, m.last_error, \
             m.available_at AS lease_expires_at, {due_at}, due.seq",
        before_max = i64::from(MAX_ATTEMPTS) - 1,
        created = checked_time("m.created_at", "created_at"),
        due_at = checked_time("due.available_at", "due_at"),
    );
    (ctes, update)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Notify;
    use std::time::Duration;

    fn config() -> PgOutboxConfig {
        PgOutboxConfig::default().with_schema("s").with_table("t")
    }

    fn statements(config: &PgOutboxConfig) -> Statements {
        Statements::new(&config.qualified_name().unwrap(), config)
    }

    #[test]
    fn claim_skips_locked_rows_and_orders_by_due_then_seq() {
        let s = statements(&config());
        assert!(s.claim.contains("FOR UPDATE OF c SKIP LOCKED"));
        assert!(s.claim.contains("ORDER BY c.available_at, c.seq LIMIT $1"));
        assert!(
            s.claim
                .contains(&format!("AND c.available_at > {MAX_TIME}")),
            "rows stranded past the decodable range are claimed to be dead-lettered"
        );
        assert!(
            s.claim
                .contains("WHERE c.dispatched_at IS NULL AND c.dead_at IS NULL AND"),
            "the claim states the due index's predicate: {}",
            s.claim
        );
        assert!(!s.claim.contains("c.partition_key"));
        assert!(!s.claim.contains("ANY($4"));
        assert!(s.claim_ids.contains("c.id = ANY($4::uuid[])"));
    }

    #[test]
    fn claims_saturate_attempts_and_return_timestamps_safely() {
        let s = statements(&config());
        assert!(s
            .claim
            .contains("attempts = least(m.attempts, 2147483646) + 1"));
        for column in ["created_at", "due_at"] {
            assert!(
                s.claim.contains(&format!("AS {column}_invalid")),
                "{column}"
            );
        }
    }

    #[test]
    fn per_key_claims_take_the_head_of_undelivered_rows_only() {
        let s = statements(&config().with_ordering(KeyOrder::PerKey));
        for sql in [&s.claim, &s.claim_ids] {
            assert!(
                sql.contains(
                    "c.seq <= (SELECT e.seq FROM \"s\".\"t\" AS e \
                     WHERE e.partition_key = c.partition_key \
                     AND e.dispatched_at IS NULL AND e.dead_at IS NULL ORDER BY e.seq LIMIT 1)"
                ),
                "{sql}"
            );
        }
    }

    #[test]
    fn a_failed_claim_is_undone_by_primary_key_and_token() {
        let s = statements(&config());
        assert!(
            s.release_claim.contains(
                "attempts = greatest(m.attempts - 1, 0) FROM unnest($2::uuid[]) AS l(id) \
                 WHERE m.id = l.id AND coalesce(m.dispatched_at, m.dead_at) IS NULL \
                 AND m.lease_token = $1"
            ),
            "{}",
            s.release_claim
        );
    }

    #[test]
    fn settles_are_fenced_batched_and_by_primary_key_only() {
        let keep = Retention::Keep {
            window: Duration::from_secs(1),
        };
        let s = statements(&config());
        let k = statements(&config().with_retention(keep));
        for sql in [
            &s.complete,
            &k.complete,
            &s.fail,
            &s.release,
            &s.dead_letter_claimed,
            &s.release_claim,
        ] {
            assert!(
                sql.contains("m.id = l.id AND coalesce(m.dispatched_at, m.dead_at) IS NULL"),
                "{sql}"
            );
            assert!(
                !sql.contains("dispatched_at IS NULL AND"),
                "a settle must not state the due index's predicate: {sql}"
            );
        }
        for sql in [&s.complete, &k.complete, &s.fail, &s.release] {
            assert!(sql.contains("unnest($1::uuid[], $2::uuid[]"), "{sql}");
            assert!(sql.contains("m.lease_token = l.token"), "{sql}");
            assert!(sql.ends_with("RETURNING m.id"), "{sql}");
        }
        assert!(s.dead_letter_claimed.contains("m.lease_token = $3::uuid"));
        assert!(s.complete.starts_with("DELETE FROM \"s\".\"t\""));
        assert!(k
            .complete
            .contains("SET dispatched_at = now(), lease_token = NULL"));
    }

    #[test]
    fn complete_and_claim_locks_its_rows_without_waiting_before_writing_them() {
        let s = statements(&config());
        assert!(
            s.complete_and_claim.starts_with(
                "WITH mine AS (SELECT m.ctid FROM \"s\".\"t\" AS m, \
                 unnest($4::uuid[], $5::uuid[]) AS l(id, token)"
            ),
            "{}",
            s.complete_and_claim
        );
        assert!(s
            .complete_and_claim
            .contains("m.lease_token = l.token FOR UPDATE OF m NOWAIT), done AS (DELETE"));
        assert!(s
            .complete_and_claim
            .contains("USING mine WHERE m.ctid = mine.ctid RETURNING m.id"));
    }

    #[test]
    fn enqueue_skips_stored_ids_and_notifies_only_when_enabled() {
        let off = statements(&config());
        assert!(off
            .enqueue
            .starts_with("WITH inserted AS (INSERT INTO \"s\".\"t\""));
        assert!(off
            .enqueue
            .contains("ORDER BY n.ord ON CONFLICT (id) DO NOTHING RETURNING id"));
        assert!(!off.enqueue.contains("$8"));
        let on = statements(&config().with_notify(Notify::OnCommit));
        assert!(on.enqueue.contains(
            "SELECT pg_notify($8, '') \
             WHERE (SELECT count(*) FROM inserted) = cardinality($1::uuid[])"
        ));
        let named = statements(&config().with_notify(Notify::Channel("c".into())));
        assert_eq!(
            named.enqueue, on.enqueue,
            "the channel is bound, not formatted"
        );
    }

    #[test]
    fn admin_statements_are_bounded_and_skip_locked_rows() {
        let s = statements(&config());
        assert!(s
            .admin
            .purge_dispatched
            .contains("LIMIT $2 FOR UPDATE SKIP LOCKED"));
        assert!(
            s.admin
                .purge_dispatched
                .contains("least($1, (extract(epoch FROM now()) * 1000000)::bigint)"),
            "a huge age saturates instead of overflowing the timestamp"
        );
        for sql in [&s.admin.requeue_matching, &s.admin.discard_matching] {
            assert!(
                sql.contains("ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED"),
                "{sql}"
            );
            assert!(sql.contains("dead_at IS NOT NULL"), "{sql}");
        }
        for sql in [&s.admin.requeue_ids, &s.admin.discard_ids] {
            assert!(
                sql.ends_with("WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL"),
                "ids touch dead letters only: {sql}"
            );
        }
        let purgeable = purgeable("$1");
        assert!(s.admin.purge_dispatched.contains(&purgeable));
        assert!(
            s.admin
                .count_dispatched
                .ends_with(&format!("WHERE {purgeable}")),
            "the dry run counts what the purge deletes: {}",
            s.admin.count_dispatched
        );
    }

    #[test]
    fn dead_letter_pages_follow_their_order_and_cursor() {
        use DeadLetterOrder::{Ascending, Descending};
        let s = statements(&config());
        let page = |order, after| s.dead_letters(order, after).to_owned();
        assert!(page(Ascending, false).ends_with("ORDER BY id LIMIT $4"));
        assert!(!page(Ascending, false).contains("$5"));
        assert!(page(Ascending, true).contains("AND id > $5"));
        assert!(page(Descending, false).ends_with("ORDER BY id DESC LIMIT $4"));
        assert!(!page(Descending, false).contains("$5"));
        assert!(page(Descending, true).contains("AND id < $5"));
        for sql in [
            page(Ascending, true),
            s.admin.count_dead.clone(),
            s.admin.requeue_matching.clone(),
        ] {
            assert!(
                sql.contains("AND ($3::uuid[] IS NULL OR id = ANY($3::uuid[]))"),
                "every filter takes the ids: {sql}"
            );
        }
    }
}
