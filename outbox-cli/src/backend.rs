//! Opening the database a URL names, and the outbox and inbox stores on it, through
//! the backend crates' public API only.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::{DedupTable, SchemaRules, TableConfig, TableRules};
use outbox_core::{schema::Schema, DedupStore, OutboxAdmin, Retention};
use outbox_dynamodb::{DynamoDedupStore, DynamoOutbox, DynamoOutboxConfig};
use outbox_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use outbox_mysql::sqlx::MySqlConnection;
use outbox_mysql::{MySqlDedupStore, MySqlOutbox, MySqlOutboxConfig};
use outbox_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use outbox_postgres::sqlx::{Connection, PgConnection, PgPool};
use outbox_postgres::{PgDedupStore, PgOutbox, PgOutboxConfig};
use outbox_sqlite::sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use outbox_sqlite::{SqliteDedupStore, SqliteOutbox, SqliteOutboxConfig};
use outbox_sqlserver::{
    MssqlConnection, MssqlDedupStore, MssqlOutbox, MssqlOutboxConfig, MssqlPool,
};

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
    Dynamo {
        client: outbox_dynamodb::aws_sdk_dynamodb::Client,
        shards: Option<u16>,
    },
    Mssql(MssqlPool),
    MySql(MySqlPool),
}

/// The outbox table, on whichever backend: the admin side for the verbs, the schema
/// side for `schema`.
#[derive(Debug)]
pub(crate) struct Outbox {
    admin: Arc<dyn OutboxAdmin>,
    schema: Arc<dyn Schema>,
}

/// A consumer's inbox (dedup) table.
#[derive(Debug)]
pub(crate) struct Inbox {
    store: Arc<dyn DedupStore>,
    schema: Arc<dyn Schema>,
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
        if global.schema.is_some() && matches!(target, Target::Dynamo { .. }) {
            return Err(Failure::usage("DynamoDB has no schemas")
                .hint("drop --schema: --table names the DynamoDB table"));
        }
        let pool = match target {
            Target::Postgres { url } => {
                Pool::Postgres(open_postgres(url, reach, global.connect_timeout).await?)
            }
            Target::Sqlite { path } => Pool::Sqlite(open_sqlite(path, reach, &url).await?),
            Target::Mssql { ado } => {
                Pool::Mssql(open_mssql(ado, reach, global.connect_timeout, &url).await?)
            }
            Target::MySql { url } => {
                Pool::MySql(open_mysql(url, reach, global.connect_timeout).await?)
            }
            Target::Dynamo(target) => Pool::Dynamo {
                client: crate::dynamo::client(target, global.connect_timeout).await,
                shards: target.shards,
            },
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
                    .map(Outbox::of)
                    .map_err(bad_name)
            }
            Pool::Sqlite(pool) => {
                let config = SqliteOutboxConfig::default()
                    .with_table(&self.table)
                    .with_retention(CLI_RETENTION);
                SqliteOutbox::new(pool.clone(), config)
                    .map(Outbox::of)
                    .map_err(bad_name)
            }
            Pool::Mssql(pool) => {
                let mut config = MssqlOutboxConfig::default()
                    .with_table(&self.table)
                    .with_retention(CLI_RETENTION);
                if let Some(schema) = &self.schema {
                    config = config.with_schema(schema);
                }
                MssqlOutbox::new(pool.clone(), config)
                    .map(Outbox::of)
                    .map_err(bad_name)
            }
            Pool::MySql(pool) => {
                let mut config = MySqlOutboxConfig::default()
                    .with_table(&self.table)
                    .with_retention(CLI_RETENTION);
                if let Some(schema) = &self.schema {
                    config = config.with_schema(schema);
                }
                MySqlOutbox::new(pool.clone(), config)
                    .map(Outbox::of)
                    .map_err(bad_name)
            }
            Pool::Dynamo { client, shards } => {
                let mut config = DynamoOutboxConfig::default()
                    .with_table(&self.table)
                    .with_retention(CLI_RETENTION);
                if let Some(shards) = shards {
                    config = config.with_shards(*shards);
                }
                DynamoOutbox::new(client.clone(), config)
                    .map(Outbox::of)
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
                PgDedupStore::new(pool.clone(), self.dedup_in_schema(retention))
                    .map(Inbox::of)
                    .map_err(bad)
            }
            Pool::Sqlite(pool) => SqliteDedupStore::new(pool.clone(), self.dedup(retention))
                .map(Inbox::of)
                .map_err(bad),
            Pool::Mssql(pool) => {
                MssqlDedupStore::new(pool.clone(), self.dedup_in_schema(retention))
                    .map(Inbox::of)
                    .map_err(bad)
            }
            Pool::MySql(pool) => {
                MySqlDedupStore::new(pool.clone(), self.dedup_in_schema(retention))
                    .map(Inbox::of)
                    .map_err(bad)
            }
            Pool::Dynamo { client, .. } => {
                DynamoDedupStore::new(client.clone(), self.dedup(retention))
                    .map(Inbox::of)
                    .map_err(bad)
            }
        }
    }

    /// Any backend's inbox config: the table, and `retention` when given.
    fn dedup<R: TableRules>(&self, retention: Option<Duration>) -> TableConfig<R, DedupTable> {
        let config = TableConfig::<R, DedupTable>::default().with_table(&self.inbox_table);
        match retention {
            Some(retention) => config.with_retention(retention),
            None => config,
        }
    }

    /// [`dedup`](Self::dedup), in `--schema` when given, for the backends with schemas.
    fn dedup_in_schema<R: SchemaRules>(
        &self,
        retention: Option<Duration>,
    ) -> TableConfig<R, DedupTable> {
        let config = self.dedup(retention);
        match &self.schema {
            Some(schema) => config.with_schema(schema),
            None => config,
        }
    }

    /// The URL, as given (printing redacts it).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl Outbox {
    fn of<T: OutboxAdmin + Schema + Clone + 'static>(outbox: T) -> Self {
        Outbox {
            admin: Arc::new(outbox.clone()),
            schema: Arc::new(outbox),
        }
    }

    /// The admin side, for every verb that reads or changes messages.
    pub(crate) fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::clone(&self.admin)
    }

    /// The table, for `schema` and for naming it in messages.
    pub(crate) fn schema(&self) -> &dyn Schema {
        &*self.schema
    }
}

impl Inbox {
    fn of<T: DedupStore + Schema + Clone + 'static>(inbox: T) -> Self {
        Inbox {
            store: Arc::new(inbox.clone()),
            schema: Arc::new(inbox),
        }
    }

    pub(crate) fn store(&self) -> &dyn DedupStore {
        &*self.store
    }

    /// The table, for `schema` and for naming it in messages.
    pub(crate) fn schema(&self) -> &dyn Schema {
        &*self.schema
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

/// A MySQL / MariaDB pool; as [`open_postgres`], one connection is made first unless
/// offline.
async fn open_mysql(url: &str, reach: Reach, timeout: Duration) -> Result<MySqlPool, Failure> {
    let options: MySqlConnectOptions = url.parse().map_err(|e| {
        Failure::usage(format!("`{url}` is not a valid MySQL URL: {e}"))
            .hint("use mysql://user:password@host:port/database (or mariadb://)")
    })?;
    if reach != Reach::Offline {
        match tokio::time::timeout(timeout, MySqlConnection::connect_with(&options)).await {
            Err(_) => {
                return Err(Failure::error(format!(
                    "no answer from {url} within {}",
                    crate::output::human(timeout)
                ))
                .hint(
                    "check that the server is running and reachable, or raise --connect-timeout",
                ))
            }
            Ok(Err(e)) => {
                let failure = Failure::error(format!("cannot connect to {url}: {e}"));
                return Err(match &e {
                    outbox_mysql::sqlx::Error::Database(_) => {
                        failure.hint("check the user, password and database in --url")
                    }
                    _ => failure.hint(
                        "check that the server is running and reachable at the host and port \
                         of --url",
                    ),
                });
            }
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
        }
    }
    Ok(MySqlPoolOptions::new()
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

/// A SQL Server pool for the ADO.NET string `ado` (from `url`). Unless offline, one
/// connection is opened first (within `timeout`), so a server that is down or refuses
/// the login fails at once with its reason; offline, nothing connects.
async fn open_mssql(
    ado: &str,
    reach: Reach,
    timeout: Duration,
    url: &str,
) -> Result<MssqlPool, Failure> {
    let connection = MssqlConnection::from_ado_string(ado)
        .and_then(|c| c.with_application_name("outbox-cli"))
        .map_err(|e| Failure::usage(format!("`{url}` is not a usable SQL Server URL: {e}")))?;
    if reach == Reach::Offline {
        return Ok(connection.lazy_pool(2));
    }
    match tokio::time::timeout(timeout, connection.pool(2)).await {
        Err(_) => Err(Failure::error(format!(
            "no answer from {url} within {}",
            crate::output::human(timeout)
        ))
        .hint("check that the server is running and reachable, or raise --connect-timeout")),
        Ok(Err(e)) => {
            let failure = Failure::error(format!("cannot connect to {url}: {}", e.report()));
            Err(match e.kind() {
                outbox_core::ErrorKind::Config => {
                    failure.hint("check the user, password and database in --url")
                }
                _ => failure.hint(
                    "check that the server is running and reachable at the host and port of \
                     --url (and ?trustServerCertificate=true for a self-signed certificate)",
                ),
            })
        }
        Ok(Ok(pool)) => Ok(pool),
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
