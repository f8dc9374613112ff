//! Finding and ending the session that holds an advisory lock, as a lock suite's
//! `sever` does (a crashed holder, a cut connection).

/// The pids of sessions named `$2` (`application_name`) holding the session advisory
/// lock whose key is `hashtextextended($1, 0)` (the key `outbox-postgres` documents for
/// a lock name), in the current database; `pg_locks` shows a bigint key's high half as
/// `classid` and its low half as `objid`. Name the lock handles' sessions so this only
/// ever finds sessions of the test binary. Returns `int4` pids.
pub const ADVISORY_LOCK_HOLDERS: &str = "\
    SELECT l.pid FROM pg_locks l \
    JOIN pg_stat_activity a ON a.pid = l.pid \
    CROSS JOIN (SELECT hashtextextended($1, 0) AS k) key \
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
    AND l.classid = ((key.k >> 32) & 4294967295)::oid \
    AND l.objid = (key.k & 4294967295)::oid \
    AND a.application_name = $2";

/// Ends the session `$1` (an `int4` pid), as a crash would; returns whether it did.
pub const TERMINATE_SESSION: &str = "SELECT pg_terminate_backend($1)";
