//! The statements a [`PgOutbox`](crate::PgOutbox) runs, built once from its config, and
//! the conversions of values for binding.
//!
//! Only validated, double-quoted identifiers are formatted into the text; every value is
//! a bound parameter. Batch statements take parallel arrays and `unnest` them, so a call
//! is one round trip however many messages it carries.

use std::time::Duration;

use outbox_core::{Error, KeyOrder, Result, Retention};

use crate::config::PgOutboxConfig;

/// Not dispatched and not dead: pending or in flight.
const UNDELIVERED: &str = "dispatched_at IS NULL AND dead_at IS NULL";

/// Columns that make a [`Message`](outbox_core::Message).
const MESSAGE_COLUMNS: &str =
    "id, destination, partition_key, payload, content_type, headers, created_at, attempts, last_error";

/// Prebuilt statement text.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `$1..$7` message arrays, `$8` channel when notifying.
    pub(crate) enqueue: String,
    /// `$1` limit, `$2` lease µs, `$3` token.
    pub(crate) claim: String,
    /// As `claim`, plus `$4` ids.
    pub(crate) claim_ids: String,
    /// `$1` ids, `$2` errors, `$3` token.
    pub(crate) dead_letter_undecodable: String,
    /// `$1` token: undo a whole claim (lease, attempt) after it could not be returned.
    pub(crate) release_claim: String,
    /// `$1` ids, `$2` tokens.
    pub(crate) complete: String,
    /// `$1` ids, `$2` tokens, `$3` errors, `$4` dead flags, `$5` retry delays µs.
    pub(crate) fail: String,
    /// `$1` ids, `$2` tokens.
    pub(crate) release: String,
    /// `$1` after id (nullable), `$2` limit.
    pub(crate) dead_letters: String,
    /// `$1` ids.
    pub(crate) requeue_dead: String,
    /// `$1` age µs (the cutoff saturates at the Unix epoch), `$2` limit.
    pub(crate) purge_dispatched: String,
    /// No parameters.
    pub(crate) stats: String,
}

impl Statements {
    pub(crate) fn new(config: &PgOutboxConfig) -> Self {
        let t = config.qualified_table();
        let per_key = config.ordering_mode() == KeyOrder::PerKey;
        let fence = format!("m.lease_token = l.token AND {}", undelivered("m"));
        Statements {
            enqueue: enqueue(&t, config.notify_channel().is_some()),
            claim: claim(&t, per_key, false),
            claim_ids: claim(&t, per_key, true),
            dead_letter_undecodable: format!(
                "UPDATE {t} AS m SET dead_at = now(), lease_token = NULL, last_error = b.error \
                 FROM unnest($1::uuid[], $2::text[]) AS b(id, error) \
                 WHERE m.id = b.id AND m.lease_token = $3 AND {}",
                undelivered("m")
            ),
            // Runs only when a claim could not be returned. No index leads with
            // lease_token, so this may read every undelivered row (never the history:
            // the partial due index covers all it can match).
            release_claim: format!(
                "UPDATE {t} AS m SET available_at = now(), lease_token = NULL, \
                 attempts = greatest(m.attempts - 1, 0) \
                 WHERE m.lease_token = $1 AND {}",
                undelivered("m")
            ),
            complete: match config.retention_mode() {
                Retention::Delete => format!(
                    "DELETE FROM {t} AS m USING unnest($1::uuid[], $2::uuid[]) AS l(id, token) \
                     WHERE m.id = l.id AND {fence} RETURNING m.id"
                ),
                Retention::Keep { .. } => format!(
                    "UPDATE {t} AS m SET dispatched_at = now(), lease_token = NULL \
                     FROM unnest($1::uuid[], $2::uuid[]) AS l(id, token) \
                     WHERE m.id = l.id AND {fence} RETURNING m.id"
                ),
            },
            fail: format!(
                "UPDATE {t} AS m SET \
                 available_at = CASE WHEN l.dead THEN m.available_at \
                     ELSE now() + l.retry_us * interval '1 microsecond' END, \
                 dead_at = CASE WHEN l.dead THEN now() END, \
                 lease_token = NULL, last_error = l.error \
                 FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bool[], $5::bigint[]) \
                     AS l(id, token, error, dead, retry_us) \
                 WHERE m.id = l.id AND {fence} RETURNING m.id"
            ),
            release: format!(
                "UPDATE {t} AS m SET available_at = now(), lease_token = NULL, \
                 attempts = greatest(m.attempts - 1, 0) \
                 FROM unnest($1::uuid[], $2::uuid[]) AS l(id, token) \
                 WHERE m.id = l.id AND {fence} RETURNING m.id"
            ),
            dead_letters: format!(
                "SELECT {MESSAGE_COLUMNS} FROM {t} \
                 WHERE dead_at IS NOT NULL AND ($1::uuid IS NULL OR id > $1) \
                 ORDER BY id LIMIT $2"
            ),
            requeue_dead: format!(
                "UPDATE {t} SET dead_at = NULL, attempts = 0, available_at = now(), \
                 lease_token = NULL WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL"
            ),
            purge_dispatched: format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} \
                 WHERE dispatched_at IS NOT NULL \
                 AND dispatched_at < now() - least($1, \
                     (extract(epoch FROM now()) * 1000000)::bigint) * interval '1 microsecond' \
                 ORDER BY dispatched_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
            stats: format!(
                "SELECT \
                 count(*) FILTER (WHERE lease_token IS NULL OR available_at <= now()) AS pending, \
                 count(*) FILTER (WHERE lease_token IS NOT NULL AND available_at > now()) \
                     AS in_flight, \
                 (extract(epoch FROM now() - min(created_at)) * 1000000)::bigint AS oldest_us, \
                 (SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL) AS dead, \
                 (SELECT count(*) FROM {t} WHERE dispatched_at IS NOT NULL) AS dispatched \
                 FROM {t} WHERE {UNDELIVERED}"
            ),
        }
    }
}

/// A duration as whole microseconds for binding.
pub(crate) fn micros(what: &str, d: Duration) -> Result<i64> {
    i64::try_from(d.as_micros())
        .map_err(|_| Error::invalid_input(format!("{what} of {d:?} is too long")))
}

/// A row count for binding as `LIMIT`. Counts beyond `i64::MAX` (the most PostgreSQL
/// takes) are clamped to it: no table holds that many rows, so the result is the same.
pub(crate) fn limit_param(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Not dispatched and not dead, for the table aliased `alias`.
fn undelivered(alias: &str) -> String {
    format!("{alias}.dispatched_at IS NULL AND {alias}.dead_at IS NULL")
}

/// One statement inserting the whole batch, notifying in the same statement.
fn enqueue(t: &str, notify: bool) -> String {
    let insert = format!(
        "INSERT INTO {t} \
         (id, destination, partition_key, payload, content_type, headers, available_at) \
         SELECT n.id, n.destination, n.partition_key, n.payload, n.content_type, n.headers, \
             now() + n.delay_us * interval '1 microsecond' \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[], \
             $6::jsonb[], $7::bigint[]) WITH ORDINALITY \
             AS n(id, destination, partition_key, payload, content_type, headers, delay_us, ord) \
         ORDER BY n.ord"
    );
    if notify {
        format!(
            "WITH inserted AS ({insert} RETURNING 1) \
             SELECT pg_notify($8, '') WHERE EXISTS (SELECT 1 FROM inserted)"
        )
    } else {
        insert
    }
}

/// Select due rows (skipping locked ones), stamp the lease, return them.
fn claim(t: &str, per_key: bool, by_ids: bool) -> String {
    let ids = if by_ids {
        "AND c.id = ANY($4::uuid[])"
    } else {
        ""
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
            undelivered("e")
        )
    } else {
        String::new()
    };
    // The update finds the locked rows by `ctid` (a TID scan): joining on `id` let the
    // planner hash-join a sequential scan of the whole table for large batches. The
    // row lock taken in `due` keeps each `ctid` valid until this statement updates it.
    format!(
        "WITH due AS (SELECT c.ctid, c.available_at, c.seq FROM {t} AS c \
         WHERE {due} AND c.available_at <= now() {ids} {key_order} \
         ORDER BY c.available_at, c.seq LIMIT $1 FOR UPDATE OF c SKIP LOCKED) \
         UPDATE {t} AS m SET available_at = now() + $2 * interval '1 microsecond', \
             lease_token = $3, attempts = m.attempts + 1 \
         FROM due WHERE m.ctid = due.ctid \
         RETURNING m.id, m.destination, m.partition_key, m.payload, m.content_type, \
             m.headers, m.created_at, m.attempts, m.last_error, \
             m.available_at AS lease_expires_at, due.available_at AS due_at, due.seq",
        due = undelivered("c"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NotifyMode;
    use outbox_core::ErrorKind;

    #[test]
    fn durations_and_limits_bind_or_fail_typed() {
        assert_eq!(micros("x", Duration::from_millis(3)).unwrap(), 3000);
        assert_eq!(
            micros("x", Duration::MAX).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(limit_param(0), 0);
        assert_eq!(limit_param(5), 5);
        assert_eq!(limit_param(usize::MAX), i64::MAX);
    }

    fn config() -> PgOutboxConfig {
        PgOutboxConfig::default().schema("s").table("t")
    }

    #[test]
    fn claim_skips_locked_rows_and_orders_by_due_then_seq() {
        let s = Statements::new(&config());
        assert!(s.claim.contains("FOR UPDATE OF c SKIP LOCKED"));
        assert!(s.claim.contains("ORDER BY c.available_at, c.seq LIMIT $1"));
        assert!(!s.claim.contains("c.partition_key"));
        assert!(!s.claim.contains("ANY($4"));
        assert!(s.claim_ids.contains("c.id = ANY($4::uuid[])"));
    }

    #[test]
    fn per_key_claims_take_the_head_of_undelivered_rows_only() {
        let s = Statements::new(&config().ordering(KeyOrder::PerKey));
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
    fn a_failed_claim_is_undone_by_its_token_only() {
        let s = Statements::new(&config());
        assert!(s.release_claim.contains(
            "attempts = greatest(m.attempts - 1, 0) WHERE m.lease_token = $1 \
             AND m.dispatched_at IS NULL AND m.dead_at IS NULL"
        ));
        assert!(!s.release_claim.contains("$2"));
    }

    #[test]
    fn settling_is_fenced_and_batched() {
        let s = Statements::new(&config());
        for sql in [&s.complete, &s.fail, &s.release] {
            assert!(sql.contains("unnest($1::uuid[], $2::uuid[]"), "{sql}");
            assert!(
                sql.contains(
                    "m.lease_token = l.token AND m.dispatched_at IS NULL AND m.dead_at IS NULL"
                ),
                "{sql}"
            );
            assert!(sql.ends_with("RETURNING m.id"), "{sql}");
        }
        assert!(s.complete.starts_with("DELETE FROM \"s\".\"t\""));
        let keep = Statements::new(&config().retention(Retention::Keep {
            window: std::time::Duration::from_secs(1),
        }));
        assert!(keep
            .complete
            .contains("SET dispatched_at = now(), lease_token = NULL"));
    }

    #[test]
    fn enqueue_notifies_in_the_same_statement_only_when_enabled() {
        let on = Statements::new(&config().notify_on_commit());
        assert!(on
            .enqueue
            .starts_with("WITH inserted AS (INSERT INTO \"s\".\"t\""));
        assert!(on.enqueue.contains("pg_notify($8, '')"));
        let named = Statements::new(&config().notify(NotifyMode::Channel("c".into())));
        assert_eq!(
            named.enqueue, on.enqueue,
            "the channel is bound, not formatted"
        );
        for off in [config(), config().notify(NotifyMode::Off)] {
            let off = Statements::new(&off);
            assert!(off.enqueue.starts_with("INSERT INTO"));
            assert!(!off.enqueue.contains("$8"));
        }
    }

    #[test]
    fn purge_is_bounded_and_skips_locked_rows() {
        let s = Statements::new(&config());
        assert!(s
            .purge_dispatched
            .contains("LIMIT $2 FOR UPDATE SKIP LOCKED"));
        assert!(
            s.purge_dispatched
                .contains("least($1, (extract(epoch FROM now()) * 1000000)::bigint)"),
            "a huge age saturates instead of overflowing the timestamp"
        );
    }
}
