//! Opening the database a URL names, and the outbox and inbox stores on it, through
//! the backend crates' public API only.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{DedupStore, OutboxAdmin, Retention};
use outbox_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use outbox_postgres::sqlx::{Connection, PgConnection, PgPool};
use outbox_postgres::{PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig};
use outbox_sqlite::sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use outbox_sqlite::{SqliteDedupConfig, SqliteDedupStore, SqliteOutbox, SqliteOutboxConfig};

use crate::cli::Global;
use crate::fail::Failure;
use crate::target::Target;

/// What the CLI's stores keep completed messages as. The CLI never completes a
/// message; this only makes `purge_dispatched` and `count_dispatched` act on the
/// history another process keeps (under `Retention::Delete` they do nothing), and
/// their age comes from `--older-than`, not from this window.
const CLI_RETENTION: Retention = Retention::Keep {
    window: Duration::from_secs(86_400),
};

/// How far a command needs the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Connect to an existing database (fail if an SQLite file is missing).
    Existing,
    /// Connect, creating an SQLite file if missing (`schema install`).
    Create,
    /// Never connect (`schema print`).
    Offline,
}

/// An open database and the names of the tables to use in it.
#[derive(Debug)]
pub(crate) struct Db {
    pool: Pool,
    url: String,
    schema: Option<String>,
    table: String,
    inbox_table: String,
}

#[derive(Debug)]
enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// The outbox table, on one backend or the other.
#[derive(Debug)]
pub(crate) enum Outbox {
    Postgres(PgOutbox),
    Sqlite(SqliteOutbox),
}

/// A consumer's inbox (dedup) table.
#[derive(Debug)]
pub(crate) enum Inbox {
    Postgres(PgDedupStore),
    Sqlite(SqliteDedupStore),
}

impl Db {
    /// Open the database `global.url` names, as far as `reach` needs.
    pub(crate) async fn open(
        global: &Global,
        target: &Target,
        reach: Reach,
    ) -> Result<Db, Failure> {
        let url = global.url.clone().unwrap_or_default();
        if global.schema.is_some() && matches!(target, Target::Sqlite { .. }) {
            return Err(Failure::usage("SQLite has no schemas")
                .hint("drop --schema: an SQLite database file holds its tables directly"));
        }
        let pool = match target {
            Target::Postgres { url } => {
                Pool::Postgres(open_postgres(url, reach, global.connect_timeout).await?)
            }
            Target::Sqlite { path } => Pool::Sqlite(open_sqlite(path, reach, &url).await?),
        };
        Ok(Db {
            pool,
            url,
            schema: global.schema.clone(),
            table: global.table.clone(),
            inbox_table: global.inbox_table.clone(),
        })
    }

    /// The outbox table.
    pub(crate) fn outbox(&self) -> Result<Outbox, Failure> {
        let place = format!("table {} at {}", self.table, self.url);
        let bad_name = |e| Failure::from_library("opening the outbox", &place, &e);
        match &self.pool {
            Pool::Postgres(pool) => {
                let mut config = PgOutboxConfig::default()
                    .with_table(&self.table)
                    .with_retention(CLI_RETENTION);
                if let Some(schema) = &self.schema {
                    config = config.with_schema(schema);
                }
                PgOutbox::new(pool.clone(), config)
                    .map(Outbox::Postgres)
                    .map_err(bad_name)
            }
            Pool::Sqlite(pool) => {
                let config = SqliteOutboxConfig::default()
                    .with_table(&self.table)
                    .with_retention(CLI_RETENTION);
                SqliteOutbox::new(pool.clone(), config)
                    .map(Outbox::Sqlite)
                    .map_err(bad_name)
            }
        }
    }

    /// The inbox table, remembering ids for `retention` (its default when `None`).
    pub(crate) fn inbox(&self, retention: Option<Duration>) -> Result<Inbox, Failure> {
        let place = format!("table {} at {}", self.inbox_table, self.url);
        let bad = |e| Failure::from_library("opening the inbox", &place, &e);
        match &self.pool {
            Pool::Postgres(pool) => {
                let mut config = PgDedupConfig::default().with_table(&self.inbox_table);
                if let Some(schema) = &self.schema {
                    config = config.with_schema(schema);
                }
                if let Some(retention) = retention {
                    config = config.with_retention(retention);
                }
                PgDedupStore::new(pool.clone(), config)
                    .map(Inbox::Postgres)
                    .map_err(bad)
            }
            Pool::Sqlite(pool) => {
                let mut config = SqliteDedupConfig::default().with_table(&self.inbox_table);
                if let Some(retention) = retention {
                    config = config.with_retention(retention);
                }
                SqliteDedupStore::new(pool.clone(), config)
                    .map(Inbox::Sqlite)
                    .map_err(bad)
            }
        }
    }

    /// The URL, as given (printing redacts it).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl Outbox {
    /// The admin side, for every verb that reads or changes messages.
    pub(crate) fn admin(&self) -> Arc<dyn OutboxAdmin> {
        match self {
            Outbox::Postgres(o) => Arc::new(o.clone()),
            Outbox::Sqlite(o) => Arc::new(o.clone()),
        }
    }

    /// The table's name as the backend prints it (`"outbox"."outbox_messages"`).
    pub(crate) fn name(&self) -> String {
        match self {
            Outbox::Postgres(o) => o.qualified_name().to_string(),
            Outbox::Sqlite(o) => o.table_name().to_string(),
        }
    }

    pub(crate) fn ddl(&self) -> String {
        match self {
            Outbox::Postgres(o) => o.ddl(),
            Outbox::Sqlite(o) => o.ddl(),
        }
    }

    pub(crate) async fn install(&self) -> outbox_core::Result<()> {
        match self {
            Outbox::Postgres(o) => o.install().await,
            Outbox::Sqlite(o) => o.install().await,
        }
    }

    /// The layout version `install` records.
    pub(crate) fn layout_version(&self) -> i64 {
        match self {
            Outbox::Postgres(_) => i64::from(outbox_postgres::SCHEMA_VERSION),
            Outbox::Sqlite(_) => outbox_sqlite::SCHEMA_VERSION,
        }
    }
}

impl Inbox {
    pub(crate) fn store(&self) -> &dyn DedupStore {
        match self {
            Inbox::Postgres(s) => s,
            Inbox::Sqlite(s) => s,
        }
    }

    /// The table's name as the backend prints it.
    pub(crate) fn name(&self) -> String {
        match self {
            Inbox::Postgres(s) => s
                .config()
                .qualified_name()
                .map_or_else(|_| s.config().table().to_owned(), |n| n.to_string()),
            Inbox::Sqlite(s) => s
                .config()
                .table_name()
                .map_or_else(|_| s.config().table().to_owned(), |n| n.to_string()),
        }
    }

    pub(crate) fn ddl(&self) -> String {
        match self {
            Inbox::Postgres(s) => s.ddl(),
            Inbox::Sqlite(s) => s.ddl(),
        }
    }

    pub(crate) async fn install(&self) -> outbox_core::Result<()> {
        match self {
            Inbox::Postgres(s) => s.install().await,
            Inbox::Sqlite(s) => s.install().await,
        }
    }
}

/// A PostgreSQL pool. Unless offline, one connection is made first, so that a server
/// that is down or refuses the login fails at once with its own reason, instead of the
/// pool retrying until its timeout.
async fn open_postgres(url: &str, reach: Reach, timeout: Duration) -> Result<PgPool, Failure> {
    let options: PgConnectOptions = url.parse().map_err(|e| {
        Failure::usage(format!("`{url}` is not a valid PostgreSQL URL: {e}"))
            .hint("use postgres://user:password@host:port/database")
    })?;
    let options = options.application_name("outbox-cli");
    if reach != Reach::Offline {
        let probe = tokio::time::timeout(timeout, PgConnection::connect_with(&options)).await;
        match probe {
            Err(_) => {
                return Err(Failure::error(format!(
                    "no answer from {url} within {}",
                    crate::output::human(timeout)
                ))
                .hint(
                    "check that the server is running and reachable, or raise --connect-timeout",
                ))
            }
            Ok(Err(e)) => return Err(connect_failure(url, &e)),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
        }
    }
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
        .connect_lazy_with(options))
}

/// Why connecting to `url` failed, and what to check.
fn connect_failure(url: &str, err: &outbox_postgres::sqlx::Error) -> Failure {
    use outbox_postgres::sqlx::Error as E;
    let failure = Failure::error(format!("cannot connect to {url}: {err}"));
    let code = match err {
        E::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    match (err, code.as_deref()) {
        (_, Some("28P01" | "28000")) => failure.hint("check the user and password in --url"),
        (_, Some("3D000")) => failure.hint("check the database name in --url; it does not exist"),
        (E::Io(_) | E::Tls(_) | E::PoolTimedOut, _) => failure
            .hint("check that the server is running and reachable at the host and port of --url"),
        _ => failure.hint("check --url"),
    }
}

/// An SQLite pool on `path`.
async fn open_sqlite(
    path: &std::path::Path,
    reach: Reach,
    url: &str,
) -> Result<SqlitePool, Failure> {
    let options = outbox_sqlite::connect_options(path);
    match reach {
        Reach::Offline => {
            Ok(SqlitePoolOptions::new().connect_lazy_with(options.create_if_missing(false)))
        }
        Reach::Create => outbox_sqlite::open(path)
            .await
            .map_err(|e| Failure::from_library("opening the database", url, &e)),
        Reach::Existing => {
            if !path.is_file() {
                return Err(Failure::error(format!(
                    "no SQLite database at {} (from {url})",
                    path.display()
                ))
                .hint("check the path in --url; `outbox schema install` creates the database and its tables"));
            }
            SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options.create_if_missing(false))
                .await
                .map_err(|e| {
                    Failure::error(format!(
                        "cannot open the SQLite database {}: {e}",
                        path.display()
                    ))
                    .hint("check that the file is an SQLite database you may read and write")
                })
        }
    }
}
