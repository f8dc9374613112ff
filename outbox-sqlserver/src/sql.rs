//! Statements as [`Stmt`]s (SQL text plus bound values): the relay's here (enqueue,
//! settles; the claim has `claim.rs`), and the [`Binder`] and time helpers every other
//! module uses for its own (`admin.rs`, `dedup.rs`, `entity.rs`, `lock.rs`,
//! `install.rs`).
//!
//! Only a [`QualifiedName`] (and names derived from it) and integers the crate
//! computes itself (row ordinals, clamped constants) are formatted into the text;
//! every value a caller or a row supplies is a [`Param`], sent as an `sp_executesql`
//! parameter (`@P1`, `@P2`, ...). The unit tests in `statement_tests` plant a quote, a
//! bracket and `--` in every value of every builder and check the text never holds
//! them, and parse every statement with a T-SQL parser.
//!
//! # Batches
//!
//! SQL Server takes at most 2,100 parameters per request and at most 1,000 rows per
//! `VALUES` constructor, so batch statements are built per chunk
//! ([`chunk_rows`]): enqueue, settles, claims of ids and admin calls by ids each send
//! as many statements as the batch needs, every one within [`PARAM_BUDGET`].
//!
//! # Time
//!
//! The clock is `SYSUTCDATETIME()`, evaluated once per statement. Durations are bound
//! as `bigint` microseconds and applied with `DATEADD`, whose number is an `int`: a
//! delay is split into seconds and the remaining microseconds (the longest,
//! [`MAX_DELAY`](outbox_core::message::MAX_DELAY), is about 3.2e8 seconds), an age
//! into days, seconds and microseconds after clamping to [`MAX_AGE`]. Timestamps come
//! back as `bigint` microseconds since the Unix epoch (`DATEDIFF_BIG`), so every
//! `datetime2` value decodes.

use std::time::Duration;

use crate::claim::pinned;
use crate::ident::QualifiedName;
use crate::schema::index;

/// SQL Server's limit on parameters in one request.
pub(crate) const MAX_PARAMS: usize = 2100;
/// What one statement of this crate binds at most: below [`MAX_PARAMS`], leaving room
/// for the `sp_executesql` arguments themselves.
pub(crate) const PARAM_BUDGET: usize = 2000;
/// SQL Server's limit on rows in one `VALUES` table value constructor.
pub(crate) const MAX_VALUES_ROWS: usize = 1000;
/// Rows one purge, requeue or discard statement touches at most on a table whose
/// `LOCK_ESCALATION` is `DISABLE` (as the installer creates it): the lock memory such a
/// statement holds stays bounded. It is not below the escalation threshold: a purged
/// row takes three key locks (the clustered key, `<table>_pk`, `<table>_dispatched`), a
/// claimed or settled row up to five, so 2,000 rows are 6,000 to 10,000 locks.
pub(crate) const DELETE_BATCH: usize = 2000;
/// Rows one claim statement takes at most, for the same reason as [`DELETE_BATCH`]: a
/// larger claim is sent as several statements sharing one token.
pub(crate) const CLAIM_BATCH: usize = DELETE_BATCH;
/// Key locks one claimed, settled or purged row takes at most.
pub(crate) const LOCKS_PER_ROW: usize = 5;
/// The locks one statement holds on one table before SQL Server escalates them to a
/// table lock (unless `LOCK_ESCALATION = DISABLE`).
pub(crate) const ESCALATION_THRESHOLD: usize = 5000;
/// Rows per claim, purge or change statement on a table whose `LOCK_ESCALATION` is not
/// `DISABLE` (a DBA's choice, or a table created by other tooling): at
/// [`LOCKS_PER_ROW`] each, below [`ESCALATION_THRESHOLD`].
pub(crate) const ESCALATING_BATCH: usize = 900;
/// The longest age a filter or purge compares with: a thousand years, past which a
/// cutoff would leave `datetime2`'s range. Longer ages are clamped to it, which
/// selects the same rows (none is that old).
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1000 * 365 * 24 * 60 * 60);

// The budgets hold by construction: a statement binds fewer parameters than SQL Server
// takes, and where escalation is on a statement takes fewer locks than escalate.
const _: () =
    assert!(PARAM_BUDGET < MAX_PARAMS && ESCALATING_BATCH * LOCKS_PER_ROW < ESCALATION_THRESHOLD);

/// A bound value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    /// `varbinary`: ids, tokens, payloads.
    Bytes(Vec<u8>),
    /// `nvarchar`, or NULL.
    Text(Option<String>),
    /// `bigint`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `bit`.
    Bool(bool),
}

/// A statement and its parameters, `@P1` being `params[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stmt {
    pub(crate) sql: String,
    pub(crate) params: Vec<Param>,
}

impl Stmt {
    /// A statement without parameters (DDL, `BEGIN TRAN`).
    pub(crate) fn text(sql: impl Into<String>) -> Self {
        Stmt {
            sql: sql.into(),
            params: Vec::new(),
        }
    }
}

/// Collects parameters while a statement is written.
#[derive(Debug, Default)]
pub(crate) struct Binder {
    params: Vec<Param>,
}

impl Binder {
    /// Bind `param`, returning its placeholder.
    pub(crate) fn bind(&mut self, param: Param) -> String {
        self.params.push(param);
        format!("@P{}", self.params.len())
    }
    /// Bind a 16-byte id or token, returning `CAST(@Pn AS binary(16))`: tiberius sends
    /// bytes as `varbinary(8000)`, and the cast gives comparisons with the `binary(16)`
    /// columns the columns' own type, so they seek their indexes.
    pub(crate) fn bind_id(&mut self, id: [u8; 16]) -> String {
        let p = self.bind(Param::Bytes(id.to_vec()));
        format!("CAST({p} AS binary(16))")
    }
    /// Finish with `sql`.
    pub(crate) fn finish(self, sql: String) -> Stmt {
        debug_assert!(self.params.len() <= PARAM_BUDGET, "{}", self.params.len());
        Stmt {
            sql,
            params: self.params,
        }
    }
}

/// How many rows of `per_row` parameters fit in one statement that also binds
/// `fixed` others.
pub(crate) fn chunk_rows(per_row: usize, fixed: usize) -> usize {
    ((PARAM_BUDGET - fixed) / per_row).clamp(1, MAX_VALUES_ROWS)
}

// Bound-parameter conversions shared by every backend (ages clamp further here).
pub(crate) use outbox_core::backend::{limit_param, micros};

/// An age as whole microseconds, clamped to [`MAX_AGE`].
pub(crate) fn age_micros(d: Duration) -> i64 {
    i64::try_from(d.min(MAX_AGE).as_micros()).unwrap_or(i64::MAX)
}

/// The clock.
pub(crate) const NOW: &str = "SYSUTCDATETIME()";

/// `SYSUTCDATETIME()` plus `us` microseconds (a `bigint` expression up to about ten
/// years).
pub(crate) fn after(us: &str) -> String {
    format!(
        "DATEADD(MICROSECOND, CAST({us} % 1000000 AS int), \
         DATEADD(SECOND, CAST({us} / 1000000 AS int), {NOW}))"
    )
}

/// `SYSUTCDATETIME()` minus `us` microseconds (a `bigint` up to [`MAX_AGE`]).
pub(crate) fn before(us: &str) -> String {
    format!(
        "DATEADD(MICROSECOND, -CAST({us} % 1000000 AS int), \
         DATEADD(SECOND, -CAST(({us} / 1000000) % 86400 AS int), \
         DATEADD(DAY, -CAST({us} / 86400000000 AS int), {NOW})))"
    )
}

/// `column` as `bigint` microseconds since the Unix epoch.
pub(crate) fn unix_us(column: &str) -> String {
    format!("DATEDIFF_BIG(MICROSECOND, CAST('19700101' AS datetime2(7)), {column})")
}

/// Not dispatched and not dead, as the filtered indexes state it: statements that must
/// use them repeat it verbatim.
pub(crate) const UNDELIVERED: &str = "dispatched_at IS NULL AND dead_at IS NULL";

/// "Undelivered" written so that no filtered index predicate matches it: settles reach
/// rows by primary key only.
fn undelivered_by_key(alias: &str) -> String {
    format!("COALESCE({alias}.dispatched_at, {alias}.dead_at) IS NULL")
}

/// The hints of every statement that reaches outbox rows by id (settles, fails,
/// dead-lettering, releases, admin changes by id): a seek on the primary key, so that
/// no plan (stale statistics, a grown history) turns the join with the bound ids into
/// a scan that locks rows the statement does not change; row locks only.
pub(crate) fn by_key(t: &QualifiedName) -> String {
    pinned(t, index::PK, "ROWLOCK")
}

/// The hints of bounded purges: a seek on `suffix`'s index of `t` (the time the purge
/// bounds), row locks, skipping locked rows, and a locking read whatever
/// `READ_COMMITTED_SNAPSHOT` says (the form in which SQL Server takes `READPAST`
/// under it). Index hints are refused on a statement's target, so a purge names its
/// target by the alias of a `FROM` occurrence that carries them ([`bounded_delete`]).
pub(crate) fn purge_hints(t: &QualifiedName, suffix: &str) -> String {
    pinned(t, suffix, "ROWLOCK, READPAST, READCOMMITTEDLOCK")
}

/// `DELETE TOP (<top>) x FROM <t> AS x <hints> WHERE <predicate>;`: a bounded delete
/// whose target is the alias `x` of a `FROM` occurrence, the only place SQL Server
/// takes index hints (on the target itself it refuses them with error 1069).
/// `predicate` names columns through `x`.
pub(crate) fn bounded_delete(t: &QualifiedName, top: &str, hints: &str, predicate: &str) -> String {
    format!("DELETE TOP ({top}) x FROM {t} AS x {hints} WHERE {predicate};")
}

/// A message to enqueue, as bound.
#[derive(Debug, Clone)]
pub(crate) struct NewRow {
    pub(crate) id: [u8; 16],
    pub(crate) destination: String,
    pub(crate) partition_key: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) content_type: Option<String>,
    pub(crate) headers: String,
    pub(crate) delay_us: i64,
}

/// Parameters per enqueued row.
pub(crate) const ENQUEUE_PARAMS: usize = 7;

/// One enqueue chunk: inserts every row in slice order (`seq` follows the `ORDER BY`)
/// unless any of their ids is stored already, in which case it inserts nothing; returns
/// the inserted ids.
pub(crate) fn enqueue(t: &QualifiedName, rows: &[NewRow]) -> Stmt {
    debug_assert!(rows.len() <= chunk_rows(ENQUEUE_PARAMS, 0));
    let mut b = Binder::default();
    let mut values = Vec::with_capacity(rows.len());
    let mut ids = Vec::with_capacity(rows.len());
    for (ord, row) in rows.iter().enumerate() {
        let id = b.bind_id(row.id);
        let fields = [
            b.bind(Param::Text(Some(row.destination.clone()))),
            b.bind(Param::Text(row.partition_key.clone())),
            b.bind(Param::Bytes(row.payload.clone())),
            b.bind(Param::Text(row.content_type.clone())),
            b.bind(Param::Text(Some(row.headers.clone()))),
            b.bind(Param::I64(row.delay_us)),
        ];
        values.push(format!("({ord}, {id}, {})", fields.join(", ")));
        ids.push(id);
    }
    let sql = format!(
        "INSERT INTO {t} (id, destination, partition_key, payload, content_type, headers, \
         available_at) OUTPUT INSERTED.id \
         SELECT b.id, b.destination, b.partition_key, b.payload, b.content_type, b.headers, \
         {available} \
         FROM (VALUES {values}) AS b(ord, id, destination, partition_key, payload, \
         content_type, headers, delay_us) \
         WHERE NOT EXISTS (SELECT 1 FROM {t} AS o WHERE o.id IN ({ids})) \
         ORDER BY b.ord;",
        available = after("b.delay_us"),
        values = values.join(", "),
        ids = ids.join(", "),
    );
    b.finish(sql)
}

/// `SELECT id` of those of `ids` that are stored.
pub(crate) fn stored_ids(t: &QualifiedName, ids: &[[u8; 16]]) -> Stmt {
    let mut b = Binder::default();
    let list = id_list(&mut b, ids);
    b.finish(format!("SELECT id FROM {t} WHERE id IN ({list});"))
}

/// Delete rows by id (taking back a partly enqueued batch in the caller's transaction),
/// only while that transaction is open and committable (`XACT_STATE() = 1`). After the
/// server rolled it back (an error under `XACT_ABORT ON`, a deadlock), or without one
/// (autocommit), the ids may name rows another transaction has since committed: those
/// are not this call's to delete.
pub(crate) fn delete_ids(t: &QualifiedName, ids: &[[u8; 16]]) -> Stmt {
    let mut b = Binder::default();
    let list = id_list(&mut b, ids);
    b.finish(format!(
        "IF XACT_STATE() = 1 DELETE FROM {t} WHERE id IN ({list});"
    ))
}

pub(crate) fn id_list(b: &mut Binder, ids: &[[u8; 16]]) -> String {
    debug_assert!(!ids.is_empty() && ids.len() <= PARAM_BUDGET);
    let list: Vec<String> = ids.iter().map(|id| b.bind_id(*id)).collect();
    list.join(", ")
}

/// What a settle does to each matched row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Delete (complete under `Retention::Delete`).
    Delete,
    /// Mark dispatched (complete under `Retention::Keep`).
    Dispatch,
    /// Give back unattempted.
    Release,
}

/// Parameters per lease in complete and release.
pub(crate) const LEASE_PARAMS: usize = 2;

/// Complete or release a chunk of leases `(id, token)`, in the order given (callers
/// pass id order), returning the ids applied. Rows are reached by primary key and
/// fenced by token and "undelivered".
pub(crate) fn settle(t: &QualifiedName, how: Settle, leases: &[([u8; 16], [u8; 16])]) -> Stmt {
    let mut b = Binder::default();
    let values: Vec<String> = leases
        .iter()
        .map(|(id, token)| {
            let id = b.bind_id(*id);
            let token = b.bind_id(*token);
            format!("({id}, {token})")
        })
        .collect();
    let join = format!(
        "FROM {t} AS m {by_key} INNER JOIN (VALUES {values}) AS l(id, token) \
         ON m.id = l.id AND m.lease_token = l.token WHERE {undelivered}",
        values = values.join(", "),
        undelivered = undelivered_by_key("m"),
        by_key = by_key(t),
    );
    let sql = match how {
        Settle::Delete => format!("DELETE m OUTPUT DELETED.id {join};"),
        Settle::Dispatch => format!(
            "UPDATE m SET dispatched_at = {NOW}, lease_token = NULL OUTPUT INSERTED.id {join};"
        ),
        Settle::Release => format!(
            "UPDATE m SET available_at = {NOW}, lease_token = NULL, \
             attempts = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END \
             OUTPUT INSERTED.id {join};"
        ),
    };
    b.finish(sql)
}

/// A failed attempt, as bound.
#[derive(Debug, Clone)]
pub(crate) struct FailRow {
    pub(crate) id: [u8; 16],
    pub(crate) token: [u8; 16],
    pub(crate) error: String,
    pub(crate) dead: bool,
    pub(crate) retry_us: i64,
}

/// Parameters per failure.
pub(crate) const FAIL_PARAMS: usize = 5;

/// Record a chunk of failed attempts: retry after a delay, or dead-letter.
pub(crate) fn fail(t: &QualifiedName, rows: &[FailRow]) -> Stmt {
    let mut b = Binder::default();
    let values: Vec<String> = rows
        .iter()
        .map(|row| {
            let fields = [
                b.bind_id(row.id),
                b.bind_id(row.token),
                b.bind(Param::Text(Some(row.error.clone()))),
                b.bind(Param::Bool(row.dead)),
                b.bind(Param::I64(row.retry_us)),
            ];
            format!("({})", fields.join(", "))
        })
        .collect();
    let sql = format!(
        "UPDATE m SET available_at = CASE WHEN l.dead = 1 THEN m.available_at \
         ELSE {retry} END, \
         dead_at = CASE WHEN l.dead = 1 THEN {NOW} END, \
         lease_token = NULL, last_error = l.error OUTPUT INSERTED.id \
         FROM {t} AS m {by_key} INNER JOIN (VALUES {values}) \
         AS l(id, token, error, dead, retry_us) \
         ON m.id = l.id AND m.lease_token = l.token WHERE {undelivered};",
        retry = after("l.retry_us"),
        values = values.join(", "),
        undelivered = undelivered_by_key("m"),
        by_key = by_key(t),
    );
    b.finish(sql)
}

/// Dead-letter claimed rows that cannot be delivered, fenced by the claim's token.
pub(crate) fn dead_letter_claimed(
    t: &QualifiedName,
    token: [u8; 16],
    rows: &[([u8; 16], String)],
) -> Stmt {
    let mut b = Binder::default();
    let token = b.bind_id(token);
    let values: Vec<String> = rows
        .iter()
        .map(|(id, reason)| {
            let id = b.bind_id(*id);
            let reason = b.bind(Param::Text(Some(reason.clone())));
            format!("({id}, {reason})")
        })
        .collect();
    let sql = format!(
        "UPDATE m SET dead_at = {NOW}, lease_token = NULL, last_error = l.error \
         FROM {t} AS m {by_key} INNER JOIN (VALUES {values}) AS l(id, error) \
         ON m.id = l.id WHERE {undelivered} AND m.lease_token = {token};",
        values = values.join(", "),
        undelivered = undelivered_by_key("m"),
        by_key = by_key(t),
    );
    b.finish(sql)
}

/// Undo a claim whose rows could not be returned: release them, attempt given back.
pub(crate) fn release_claim(t: &QualifiedName, token: [u8; 16], ids: &[[u8; 16]]) -> Stmt {
    let mut b = Binder::default();
    let token = b.bind_id(token);
    let values: Vec<String> = ids
        .iter()
        .map(|id| format!("({})", b.bind_id(*id)))
        .collect();
    let sql = format!(
        "UPDATE m SET available_at = {NOW}, lease_token = NULL, \
         attempts = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END \
         FROM {t} AS m {by_key} INNER JOIN (VALUES {values}) AS l(id) \
         ON m.id = l.id WHERE {undelivered} AND m.lease_token = {token};",
        values = values.join(", "),
        undelivered = undelivered_by_key("m"),
        by_key = by_key(t),
    );
    b.finish(sql)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn durations_and_limits_bind_or_fail_typed() {
        assert_eq!(micros("x", Duration::from_millis(3)).unwrap(), 3000);
        assert_eq!(
            micros("x", Duration::MAX).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            age_micros(Duration::MAX),
            i64::try_from(MAX_AGE.as_micros()).unwrap()
        );
        // The clamped age splits into DATEADD's int arguments.
        let days = age_micros(Duration::MAX) / 86_400_000_000;
        assert!(i32::try_from(days).is_ok());
        let max_delay_secs = micros("d", outbox_core::message::MAX_DELAY).unwrap() / 1_000_000;
        assert!(i32::try_from(max_delay_secs).is_ok());
        assert_eq!(limit_param(usize::MAX), i64::MAX);
    }

    #[test]
    fn chunks_fit_the_parameter_and_values_limits() {
        for (per_row, fixed) in [
            (ENQUEUE_PARAMS, 0),
            (LEASE_PARAMS, 0),
            (FAIL_PARAMS, 0),
            (1, 3),
            (2, 1),
            (1, 1),
        ] {
            let rows = chunk_rows(per_row, fixed);
            assert!(rows * per_row + fixed <= PARAM_BUDGET, "{per_row} {fixed}");
            assert!(rows <= MAX_VALUES_ROWS);
            assert!((rows + 1) * per_row + fixed > PARAM_BUDGET || rows == MAX_VALUES_ROWS);
        }
    }
}
