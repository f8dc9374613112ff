//! Opening a database the way this crate expects: [`connect_options`], [`open`] and
//! [`open_in_memory`].

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::{Error, ErrorKind, Result};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::from_sqlx;

/// How long a statement waits for another connection's write lock before failing with
/// a retryable [`ErrorKind::Contention`] error (`SQLITE_BUSY`).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connection options for a database file at `path` (created if missing), set up as
/// this crate expects:
///
/// - **WAL journal** (`journal_mode = WAL`): readers do not block the writer, nor the
///   writer readers; claims and settles (writes) still take turns.
/// - **Busy timeout** of [`BUSY_TIMEOUT`]: a write waiting for the lock retries for
///   that long instead of failing at once with `SQLITE_BUSY`.
/// - **`synchronous = FULL`**: every commit is on disk before it returns. With
///   `NORMAL` (faster), a power loss can take back the last commits of a WAL database;
///   a relay may already have published messages of a transaction that is then gone.
///   Relax it only if the host's storage is trusted to survive power loss.
/// - Foreign keys on.
///
/// Adjust the options further (pool size, pragmas) before connecting.
pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true)
}

/// A pool on the database file at `path` (created if missing), with
/// [`connect_options`].
///
/// # Errors
/// [`ErrorKind::Unavailable`] when the file cannot be opened or created.
pub async fn open(path: impl AsRef<Path>) -> Result<SqlitePool> {
    let path = path.as_ref();
    SqlitePoolOptions::new()
        .connect_with(connect_options(path))
        .await
        .map_err(|e| {
            let err = from_sqlx(&format!("opening {}", path.display()), e);
            if err.kind() == ErrorKind::Storage {
                Error::new(ErrorKind::Unavailable, err.message().to_owned()).with_source(err)
            } else {
                err
            }
        })
}

/// A pool on a private in-memory database, for tests and throwaway runs: every
/// connection of the pool shares it (SQLite's shared cache), and it lives as long as
/// the pool does (connections are never retired for age or idleness, the last one
/// closing would drop the data). Each call makes a new, empty database.
///
/// In shared-cache mode SQLite locks tables rather than the whole file and has no
/// WAL; the contracts hold the same way, but measure on a file.
///
/// # Errors
/// Mapped driver errors (SQLite out of memory, say).
pub async fn open_in_memory() -> Result<SqlitePool> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("file:outbox-memory-{}-{nanos}-{seq}", std::process::id());
    let options = SqliteConnectOptions::new()
        .filename(name)
        .in_memory(true)
        .shared_cache(true)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true);
    SqlitePoolOptions::new()
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await
        .map_err(|e| from_sqlx("opening an in-memory database", e))
}
