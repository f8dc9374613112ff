//! Pooled sessions: [`MssqlSession`] (a tiberius client, and whether the pool must close
//! it rather than reuse it), the [`MssqlTransaction`] guard that marks its session
//! broken when dropped before it ends, and the pool's [`MssqlManager`], whose check-out
//! statement puts every reused session back to the settings the crate relies on.
//!
//! # Why sessions are closed rather than cleaned
//!
//! A transaction holds its locks until it ends. If the future running it is dropped
//! between `BEGIN` and `COMMIT` (a caller's time-out, a cancelled task), nothing can
//! send a `ROLLBACK` (there is no async drop), so the session would sit in the pool
//! with the transaction and its locks open until its next check-out. A session whose
//! [`MssqlTransaction`] is dropped unfinished is therefore marked broken, and the pool
//! closes it when the connection comes back ([`bb8::ManageConnection::has_broken`]):
//! the server ends the session and rolls the transaction back at once.
//!
//! A transaction begun with a bare `BEGIN TRANSACTION` on a pooled connection is not
//! seen by the pool: it is rolled back at the connection's next check-out only.
//!
//! # What a check-out puts back, and what it checks
//!
//! tiberius cannot send `sp_reset_connection`, so the check-out batch ([`check_out`])
//! undoes by statement what a caller may leave on a shared session: an open
//! transaction, impersonation (`EXECUTE AS` without `REVERT`), the database (`USE`),
//! `DEADLOCK_PRIORITY`, `CONTEXT_INFO`, the isolation level, `XACT_ABORT`,
//! `LOCK_TIMEOUT` and the options the crate's statements need. It ends by reading the
//! session's database, login and user, and a session that does not match what it was
//! when it connected (an `EXECUTE AS ... WITH NO REVERT`, a database that could not be
//! restored) is closed instead of handed out. Not reset: keys set with
//! `sp_set_session_context` (read-only ones cannot be), temporary tables and open
//! cursors, `SET LANGUAGE`; a caller who uses those on pooled sessions must undo them.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use outbox_core::{Error, Result};

use crate::error::{from_connect, from_tiberius, in_context, Platform};

/// A tiberius client on a tokio TCP stream: what your own statements and transactions
/// run on (a [`MssqlSession`] and a [`MssqlTransaction`] deref to it), and what
/// [`MssqlOutbox::enqueue`](crate::MssqlOutbox::enqueue) takes.
pub type MssqlClient = bb8_tiberius::rt::Client;

/// A bb8 pool of [`MssqlSession`]s.
pub type MssqlPool = bb8::Pool<MssqlManager>;

/// How long a statement waits for a lock before failing with error 1222, unless
/// [`MssqlConnection::with_lock_timeout`](crate::MssqlConnection::with_lock_timeout)
/// says otherwise: ten seconds. A claim that waited longer than a small part of its
/// lease would return rows the relay has no time left to publish.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one of the crate's own statements on a pooled session may run before the
/// call fails with [`ErrorKind::Timeout`](outbox_core::ErrorKind::Timeout) and the
/// session is closed, unless
/// [`MssqlConnection::with_statement_timeout`](crate::MssqlConnection::with_statement_timeout)
/// says otherwise: thirty seconds. A claim's bound is the shorter of this and its
/// lease. `LOCK_TIMEOUT` bounds lock waits only; this bounds everything else (memory
/// grants, log writes, a half-open connection after a failover).
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Who and where a session was when it connected: the database every check-out puts
/// back with `USE`, and the login and user it must still be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) database: String,
    pub(crate) login: String,
    pub(crate) user: String,
}

/// Reads a session's [`Identity`] (the check-out ends with it too).
pub(crate) const IDENTITY: &str =
    "SELECT DB_NAME() AS db, SUSER_SNAME() AS login, USER_NAME() AS usr";

/// One pooled session on the server: a tiberius client (it derefs to [`MssqlClient`]),
/// and whether the pool must close it instead of handing it out again.
///
/// Begin your transactions with [`begin`](Self::begin): if the future running one is
/// dropped before [`commit`](MssqlTransaction::commit) or
/// [`rollback`](MssqlTransaction::rollback), the session is marked broken and the pool
/// closes it, which ends the transaction and its locks on the server at once.
pub struct MssqlSession {
    client: MssqlClient,
    broken: bool,
    identity: Option<Identity>,
    statement_timeout: Option<Duration>,
}

impl MssqlSession {
    fn new(client: MssqlClient, statement_timeout: Option<Duration>) -> Self {
        MssqlSession {
            client,
            broken: false,
            identity: None,
            statement_timeout,
        }
    }

    /// The client and the broken flag, apart: a statement runs on the one while a
    /// [`BreakOnDrop`] guards the other.
    pub(crate) fn parts(&mut self) -> (&mut MssqlClient, &mut bool) {
        (&mut self.client, &mut self.broken)
    }

    /// How long the crate's statements on this session may run.
    pub(crate) fn statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// Begin a transaction (`BEGIN TRANSACTION`) and return the guard that ends it.
    ///
    /// # Errors
    /// Mapped driver errors; the session is then marked broken.
    pub async fn begin(&mut self) -> Result<MssqlTransaction<'_>> {
        let MssqlSession { client, broken, .. } = self;
        // Armed before the request is sent: a future dropped while `BEGIN` is in
        // flight may leave a transaction open too.
        let open = BreakOnDrop::new(broken);
        run_batch(client, BEGIN, "begin a transaction").await?;
        Ok(MssqlTransaction { client, open })
    }

    /// Have the pool close this session when it comes back instead of reusing it.
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Whether the pool will close this session when it comes back.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// The client, out of the session (a connection no pool will see again).
    pub fn into_client(self) -> MssqlClient {
        self.client
    }
}

impl Deref for MssqlSession {
    type Target = MssqlClient;

    fn deref(&self) -> &MssqlClient {
        &self.client
    }
}

impl DerefMut for MssqlSession {
    fn deref_mut(&mut self) -> &mut MssqlClient {
        &mut self.client
    }
}

impl fmt::Debug for MssqlSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlSession")
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// An open transaction on a [`MssqlSession`], from [`MssqlSession::begin`]; it derefs to
/// the session's [`MssqlClient`], so statements (and
/// [`MssqlOutbox::enqueue`](crate::MssqlOutbox::enqueue)) run on it.
///
/// End it with [`commit`](Self::commit) or [`rollback`](Self::rollback). Dropped
/// otherwise (a cancelled future, an early return, a `COMMIT` sent by hand), it marks
/// the session broken, so the pool closes the connection and the server rolls back
/// whatever is still open.
pub struct MssqlTransaction<'a> {
    client: &'a mut MssqlClient,
    open: BreakOnDrop<'a>,
}

impl MssqlTransaction<'_> {
    /// Commit (`COMMIT TRANSACTION`).
    ///
    /// # Errors
    /// Mapped driver errors: the outcome is then unknown, and the session is marked
    /// broken.
    pub async fn commit(self) -> Result<()> {
        let MssqlTransaction { client, open } = self;
        run_batch(client, COMMIT, "commit").await?;
        open.disarm();
        Ok(())
    }

    /// Roll back whatever is still open (`IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION`: the
    /// server may already have rolled it back, for example after a deadlock).
    ///
    /// # Errors
    /// Mapped driver errors; the session is then marked broken.
    pub async fn rollback(self) -> Result<()> {
        let MssqlTransaction { client, open } = self;
        run_batch(client, ROLLBACK_IF_OPEN, "roll back").await?;
        open.disarm();
        Ok(())
    }
}

impl Deref for MssqlTransaction<'_> {
    type Target = MssqlClient;

    fn deref(&self) -> &MssqlClient {
        self.client
    }
}

impl DerefMut for MssqlTransaction<'_> {
    fn deref_mut(&mut self) -> &mut MssqlClient {
        self.client
    }
}

impl fmt::Debug for MssqlTransaction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlTransaction").finish_non_exhaustive()
    }
}

/// Sets its session's `broken` flag when dropped, unless [`disarm`](Self::disarm)ed
/// first: the transaction or statement it stands for ended cleanly.
#[derive(Debug)]
pub(crate) struct BreakOnDrop<'a> {
    broken: &'a mut bool,
    armed: bool,
}

impl<'a> BreakOnDrop<'a> {
    pub(crate) fn new(broken: &'a mut bool) -> Self {
        BreakOnDrop {
            broken,
            armed: true,
        }
    }

    /// The transaction ended: leave the session as it is.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for BreakOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            *self.broken = true;
            tracing::debug!(
                "a transaction or statement was dropped before it ended; its session will \
                 be closed"
            );
        }
    }
}

/// Run a batch without parameters (so `BEGIN`/`COMMIT` change the session's
/// transaction count, which `sp_executesql` would refuse with error 266, and `SET`s
/// outlast the request), reading every result; returns the rows of the last result.
async fn batch_rows(client: &mut MssqlClient, sql: &str, what: &str) -> Result<Vec<tiberius::Row>> {
    let mut sets = client
        .simple_query(sql)
        .await
        .map_err(|e| from_tiberius(what, e))?
        .into_results()
        .await
        .map_err(|e| from_tiberius(what, e))?;
    Ok(sets.pop().unwrap_or_default())
}

async fn run_batch(client: &mut MssqlClient, sql: &str, what: &str) -> Result<()> {
    batch_rows(client, sql, what).await.map(drop)
}

/// The [`Identity`] in the last row of `rows` (from [`IDENTITY`]).
fn identity_of(rows: &[tiberius::Row]) -> Result<Identity> {
    let row = rows
        .last()
        .ok_or_else(|| crate::error::decode_error("the session's identity returned no row"))?;
    let text = |column: &str| crate::exec::row_str(row, column);
    Ok(Identity {
        database: text("db")?,
        login: text("login")?,
        user: text("usr")?,
    })
}

/// Begins the crate's own transactions.
pub(crate) const BEGIN: &str = "BEGIN TRANSACTION";
/// Commits them.
pub(crate) const COMMIT: &str = "COMMIT TRANSACTION";
/// Rolls back whatever is open, on error paths.
pub(crate) const ROLLBACK_IF_OPEN: &str = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION";

/// The session options [`check_out`] sets, each to the value the crate's statements
/// need: the ones SQL Server requires for writes to tables with filtered indexes
/// (otherwise error 1934), and the ones that change what a statement returns.
pub(crate) const SESSION_OPTIONS: &[(&str, &str)] = &[
    ("ANSI_NULLS", "ON"),
    ("ANSI_PADDING", "ON"),
    ("ANSI_WARNINGS", "ON"),
    ("ARITHABORT", "ON"),
    ("CONCAT_NULL_YIELDS_NULL", "ON"),
    ("NUMERIC_ROUNDABORT", "OFF"),
    ("QUOTED_IDENTIFIER", "ON"),
    // Row counts of purges and admin changes come from the DONE tokens `NOCOUNT`
    // suppresses; `ROWCOUNT n` would cut every claim and purge short; a `TEXTSIZE`
    // below a payload would truncate it in a claim's OUTPUT.
    ("NOCOUNT", "OFF"),
    ("ROWCOUNT", "0"),
    ("TEXTSIZE", "2147483647"),
];

/// Run on every connection taken from the pool: roll back a transaction left open, and
/// put back the session settings the crate's statements rely on. The pool is shared
/// with callers' own transactions, and tiberius has no `sp_reset_connection`:
///
/// - `REVERT` (up to four nested `EXECUTE AS`; an error there, as with nothing to
///   revert to, is caught), then `USE` of `database`, the session's database when it
///   connected;
/// - `DEADLOCK_PRIORITY NORMAL` and an empty `CONTEXT_INFO`;
/// - `IMPLICIT_TRANSACTIONS OFF` (or a claim would keep its locks in a transaction
///   nobody commits), READ COMMITTED (a caller's SERIALIZABLE would take key-range
///   locks; SNAPSHOT makes `READPAST` fail with error 650), `XACT_ABORT OFF`;
/// - `LOCK_TIMEOUT` in milliseconds (`-1`, wait for ever, when `lock_timeout` is
///   `None`), so a blocked statement fails with error 1222 instead of waiting without
///   end;
/// - [`SESSION_OPTIONS`], so a caller's `SET` cannot make an outbox write fail;
/// - and last [`IDENTITY`], which the manager compares with the session's.
pub(crate) fn check_out(lock_timeout: Option<Duration>, database: Option<&str>) -> String {
    let mut sql = String::from(
        "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; \
         BEGIN TRY REVERT; REVERT; REVERT; REVERT; END TRY BEGIN CATCH END CATCH; ",
    );
    if let Some(database) = database {
        sql.push_str(&format!("USE {}; ", crate::ident::quote(database)));
    }
    sql.push_str(&format!(
        "SET DEADLOCK_PRIORITY NORMAL; SET CONTEXT_INFO 0x; SET IMPLICIT_TRANSACTIONS OFF; \
         SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET XACT_ABORT OFF; \
         SET LOCK_TIMEOUT {}; ",
        lock_timeout_ms(lock_timeout)
    ));
    for (option, value) in SESSION_OPTIONS {
        sql.push_str(&format!("SET {option} {value}; "));
    }
    sql.push_str(IDENTITY);
    sql
}

/// `LOCK_TIMEOUT`'s argument: whole milliseconds, rounded up (a non-zero time-out never
/// becomes 0, "do not wait at all"), at most `i32::MAX`; `-1` for no time-out.
pub(crate) fn lock_timeout_ms(lock_timeout: Option<Duration>) -> i64 {
    match lock_timeout {
        None => -1,
        Some(timeout) => {
            let ms = timeout.as_nanos().div_ceil(1_000_000);
            i64::try_from(ms).map_or(i64::from(i32::MAX), |ms| ms.min(i64::from(i32::MAX)))
        }
    }
}

/// The pool's connection manager: bb8-tiberius's, plus
///
/// - a check-out test that rolls back a transaction left open, restores the session
///   settings (isolation level, `XACT_ABORT`, `LOCK_TIMEOUT`, the ANSI options) and
///   replaces a connection that does not answer;
/// - [`has_broken`](bb8::ManageConnection::has_broken) reporting sessions marked broken
///   (see [`MssqlTransaction`]), which the pool then closes;
/// - errors mapped to [`outbox_core::Error`] knowing the server's platform (error 4060
///   is transient on Azure SQL only).
pub struct MssqlManager {
    inner: bb8_tiberius::ConnectionManager,
    platform: Platform,
    lock_timeout: Option<Duration>,
    statement_timeout: Option<Duration>,
}

/// TCP keepalive on every connection: probes after a minute idle, every ten seconds,
/// so a connection a failover left half-open fails in about two minutes instead of
/// the operating system's default (hours idle, or about fifteen minutes of
/// retransmissions).
pub(crate) const KEEPALIVE: (Duration, Duration) =
    (Duration::from_secs(60), Duration::from_secs(10));

fn configure_tcp(tcp: &tokio::net::TcpStream) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    let (idle, interval) = KEEPALIVE;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

impl MssqlManager {
    /// A manager connecting with `config`, with [`DEFAULT_LOCK_TIMEOUT`],
    /// [`DEFAULT_STATEMENT_TIMEOUT`] and TCP keepalive.
    pub fn new(config: tiberius::Config) -> Self {
        let platform = Platform::of_config(&config);
        MssqlManager {
            inner: bb8_tiberius::ConnectionManager::new(config)
                .with_modify_tcp_stream(configure_tcp),
            platform,
            lock_timeout: Some(DEFAULT_LOCK_TIMEOUT),
            statement_timeout: Some(DEFAULT_STATEMENT_TIMEOUT),
        }
    }

    /// The same manager setting `LOCK_TIMEOUT` to `timeout` on every check-out (`None`:
    /// statements wait for locks without end).
    #[must_use]
    pub fn with_lock_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The same manager bounding the crate's own statements on its sessions by
    /// `timeout` (`None`: no bound); see [`DEFAULT_STATEMENT_TIMEOUT`].
    #[must_use]
    pub fn with_statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.statement_timeout = timeout;
        self
    }
}

impl fmt::Debug for MssqlManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlManager")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

impl bb8::ManageConnection for MssqlManager {
    type Connection = MssqlSession;
    type Error = Error;

    async fn connect(&self) -> std::result::Result<MssqlSession, Error> {
        let client = self
            .inner
            .connect()
            .await
            .map_err(|e| from_connect("connect to SQL Server", e, self.platform))?;
        let mut session = MssqlSession::new(client, self.statement_timeout);
        let rows = batch_rows(
            &mut session.client,
            IDENTITY,
            "read a new session's identity",
        )
        .await?;
        session.identity = Some(identity_of(&rows)?);
        Ok(session)
    }

    async fn is_valid(&self, conn: &mut MssqlSession) -> std::result::Result<(), Error> {
        let database = conn.identity.as_ref().map(|i| i.database.as_str());
        let sql = check_out(self.lock_timeout, database);
        let rows = batch_rows(&mut conn.client, &sql, "reset a pooled session").await?;
        same_identity(conn.identity.as_ref(), &identity_of(&rows)?)
    }

    fn has_broken(&self, conn: &mut MssqlSession) -> bool {
        conn.broken
    }
}

/// Whether a reset session is still who and where it was when it connected (`None`:
/// nothing was recorded, nothing to compare).
fn same_identity(expected: Option<&Identity>, now: &Identity) -> Result<()> {
    match expected {
        Some(expected) if expected != now => {
            tracing::warn!(
                ?expected,
                ?now,
                "a pooled session kept another database or identity after its reset; it is closed"
            );
            Err(Error::new(
                outbox_core::ErrorKind::Storage,
                "a pooled session could not be put back to its database and login",
            ))
        }
        _ => Ok(()),
    }
}

/// A dedicated connection from `pool`'s manager: not pooled, closed when dropped.
pub(crate) async fn dedicated(pool: &MssqlPool, what: &str) -> Result<MssqlClient> {
    pool.dedicated_connection()
        .await
        .map(MssqlSession::into_client)
        .map_err(|e| in_context(what, e))
}

/// Roll back whatever transaction `client` has open, ignoring errors: used on error
/// paths of the crate's own transactions on dedicated connections, before they close.
pub(crate) async fn rollback_quietly(client: &mut MssqlClient) {
    if let Err(err) = run_batch(client, ROLLBACK_IF_OPEN, "roll back").await {
        tracing::debug!(error = %err.report(), "rollback failed; the connection closes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    /// A caller's transaction: armed at `BEGIN`, then waiting on its next statement
    /// (which never answers here), as a future the caller may drop.
    async fn transaction_waiting_on_a_statement(broken: &mut bool) {
        let open = BreakOnDrop::new(broken);
        futures::future::pending::<()>().await;
        open.disarm();
    }

    #[test]
    fn a_transaction_dropped_midway_marks_its_session_broken() {
        let mut broken = false;
        {
            let mut future = pin!(transaction_waiting_on_a_statement(&mut broken));
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            assert_eq!(future.as_mut().poll(&mut cx), Poll::Pending);
            // The caller gives up here: the future is dropped between BEGIN and COMMIT.
        }
        assert!(broken, "the pool must close the session");
    }

    #[test]
    fn a_transaction_that_ended_leaves_its_session_usable() {
        let mut broken = false;
        BreakOnDrop::new(&mut broken).disarm();
        assert!(!broken);
        // An early return (an error before COMMIT) drops the guard armed.
        let mut broken = false;
        drop(BreakOnDrop::new(&mut broken));
        assert!(broken);
    }

    #[test]
    fn a_session_that_kept_another_database_or_login_is_refused() {
        let connected = Identity {
            database: "app".into(),
            login: "svc".into(),
            user: "dbo".into(),
        };
        assert!(same_identity(Some(&connected), &connected.clone()).is_ok());
        for changed in [
            Identity {
                database: "master".into(),
                ..connected.clone()
            },
            Identity {
                login: "sa".into(),
                ..connected.clone()
            },
            Identity {
                user: "guest".into(),
                ..connected.clone()
            },
        ] {
            assert!(
                same_identity(Some(&connected), &changed).is_err(),
                "{changed:?}"
            );
        }
        // Nothing recorded (the identity read failed at connect): nothing to compare.
        assert!(same_identity(None, &connected).is_ok());
    }

    #[test]
    fn lock_timeouts_become_milliseconds() {
        assert_eq!(lock_timeout_ms(None), -1);
        assert_eq!(lock_timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(lock_timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(lock_timeout_ms(Some(Duration::from_millis(2500))), 2500);
        assert_eq!(lock_timeout_ms(Some(DEFAULT_LOCK_TIMEOUT)), 10_000);
        assert_eq!(
            lock_timeout_ms(Some(Duration::MAX)),
            i64::from(i32::MAX),
            "LOCK_TIMEOUT takes an int"
        );
    }
}
