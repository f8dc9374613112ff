//! Opening a database the way this crate expects: [`connect_options`], [`open`] and
//! [`open_in_memory`].

use std::path::Path;
use std::time::Duration;

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

/// A pool on a private in-memory database, for tests and throwaway runs: a pool of
/// **one** connection (each call makes a new, empty database, and it lives as long as
/// the pool: the connection is never retired for age or idleness).
///
/// One connection means every use of the pool takes turns: a task that holds a
/// transaction and calls a store on the same pool waits for the connection, and after
/// [`BUSY_TIMEOUT`] gets a [`ErrorKind::Timeout`] error, where on a file the store
/// would read at once or fail with a retryable contention. (SQLite's shared-cache
/// mode would let several connections share a memory database, but its table locks
/// are waited on without any timeout.) Nothing is written to disk, so there is no WAL
/// and no durability; measure and deploy on a file.
///
/// # Errors
/// Mapped driver errors (SQLite out of memory, say).
pub async fn open_in_memory() -> Result<SqlitePool> {
    let options = SqliteConnectOptions::new()
        .in_memory(true)
        .shared_cache(false)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true);
    SqlitePoolOptions::new()
        .min_connections(1)
        .max_connections(1)
        .acquire_timeout(BUSY_TIMEOUT)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await
        .map_err(|e| from_sqlx("opening an in-memory database", e))
}
