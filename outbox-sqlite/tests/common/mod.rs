//! Shared helpers for the integration tests: a fresh database file per store, removed
//! when the test ends.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use outbox_core::{Error, ErrorKind};
use sqlx::SqlitePool;

/// A database file of its own in the system's temporary directory; the file and its
/// WAL companions are removed when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct TempDb {
    inner: Arc<TempPath>,
    pool: SqlitePool,
}

#[derive(Debug)]
struct TempPath(PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl TempDb {
    /// A new, empty database file opened with `outbox_sqlite::open`.
    pub async fn new() -> TempDb {
        let path = std::env::temp_dir().join(format!(
            "outbox-sqlite-test-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let pool = outbox_sqlite::open(&path)
            .await
            .expect("open a temp database");
        TempDb {
            inner: Arc::new(TempPath(path)),
            pool,
        }
    }

    /// The pool on it.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.0
    }
}

/// Map a raw sqlx error in test plumbing.
pub fn storage(e: sqlx::Error) -> Error {
    Error::new(ErrorKind::Storage, "test plumbing").with_source(e)
}
