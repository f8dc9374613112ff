//! Connecting: [`MssqlConnection`] (an ADO.NET connection string whose `Debug` never
//! shows a secret, and the lock time-out pooled sessions get) and the bb8 pool built
//! from it (the sessions themselves are in `session.rs`).

use std::fmt;
use std::time::Duration;

use bb8::ManageConnection;
use outbox_core::{Error, Result};

use crate::error::in_context;
use crate::session::{
    MssqlClient, MssqlManager, MssqlPool, DEFAULT_LOCK_TIMEOUT, DEFAULT_STATEMENT_TIMEOUT,
};

/// Keys whose values `Debug` may show: addresses, names and switches. Every other
/// key's value (`Password`, `PWD`, and anything this list does not know) is shown as
/// `<redacted>`.
const SHOWN_KEYS: &[&str] = &[
    "server",
    "data source",
    "addr",
    "address",
    "network address",
    "database",
    "initial catalog",
    "user id",
    "uid",
    "user",
    "application name",
    "app",
    "encrypt",
    "trustservercertificate",
    "trust server certificate",
    "integrated security",
    "trusted_connection",
    "applicationintent",
    "application intent",
];

/// Where and how to connect, from an ADO.NET connection string
/// (`server=tcp:host,1433;database=app;user id=sa;password=...;TrustServerCertificate=true`).
///
/// The string is parsed by tiberius (`Config::from_ado_string`); this type keeps it so
/// pools and dedicated lock connections can be opened from it, and writes `Debug` by
/// hand: values of keys other than addresses, names and switches are shown as
/// `<redacted>`, so a password never reaches a log.
///
/// ```
/// use outbox_sqlserver::MssqlConnection;
///
/// let conn = MssqlConnection::from_ado_string(
///     "server=tcp:localhost,1433;user id=sa;password='p;w=d';TrustServerCertificate=true",
/// )?;
/// let shown = format!("{conn:?}");
/// assert!(shown.contains("user id=sa") && shown.contains("password=<redacted>"));
/// assert!(!shown.contains("p;w=d"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone)]
pub struct MssqlConnection {
    ado: String,
    pairs: Vec<(String, String)>,
    config: tiberius::Config,
    lock_timeout: Option<Duration>,
    statement_timeout: Option<Duration>,
}

impl MssqlConnection {
    /// Parse an ADO.NET connection string.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when the string does not parse; the message never quotes
    /// it (it holds the password).
    pub fn from_ado_string(ado: &str) -> Result<Self> {
        let pairs = ado_pairs(ado)?;
        // The driver's parse error may quote the string, password included: not kept.
        let config = tiberius::Config::from_ado_string(ado).map_err(|_| {
            Error::config("the SQL Server connection string was rejected by the driver")
        })?;
        Ok(MssqlConnection {
            ado: ado.to_owned(),
            pairs,
            config,
            lock_timeout: Some(DEFAULT_LOCK_TIMEOUT),
            statement_timeout: Some(DEFAULT_STATEMENT_TIMEOUT),
        })
    }

    /// The same connection whose pooled sessions give each of the crate's own
    /// statements at most `timeout` (a claim the shorter of this and its lease): past
    /// it the call fails with a retryable
    /// [`ErrorKind::Timeout`](outbox_core::ErrorKind::Timeout) and the session is
    /// closed, not reused, since a request may still be running on it. `None` sets no
    /// bound. Default [`DEFAULT_STATEMENT_TIMEOUT`]. Your own statements are not bounded
    /// by it.
    #[must_use]
    pub fn with_statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// The bound on the crate's own statements on pooled sessions.
    pub fn statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// The same connection whose pooled sessions wait at most `timeout` for a lock
    /// (`SET LOCK_TIMEOUT`, set on every check-out), then fail the statement with error
    /// 1222, a retryable [`ErrorKind::Contention`](outbox_core::ErrorKind::Contention);
    /// `None` waits without end. Default [`DEFAULT_LOCK_TIMEOUT`]. It applies to your
    /// own statements on pooled connections too; under `XACT_ABORT OFF` error 1222
    /// cancels the statement and leaves the transaction open.
    #[must_use]
    pub fn with_lock_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The lock time-out pooled sessions get.
    pub fn lock_timeout(&self) -> Option<Duration> {
        self.lock_timeout
    }

    /// The tiberius configuration.
    pub fn tiberius_config(&self) -> tiberius::Config {
        self.config.clone()
    }

    /// The same connection with `Application Name` set to `name` (visible as
    /// `program_name` in `sys.dm_exec_sessions`).
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a name with `;`, `'`,
    /// `"`, `=`, `{` or `}`, which cannot be written into the string unambiguously.
    pub fn with_application_name(&self, name: &str) -> Result<Self> {
        if name.contains([';', '\'', '"', '=', '{', '}']) {
            return Err(Error::config(
                "an application name may not contain ; ' \" = { or }",
            ));
        }
        // tiberius refuses an empty pair (`;;`), so a string that ends with `;` is
        // trimmed first.
        let base = self.ado.trim_end_matches([';', ' ', '\n']);
        Self::from_ado_string(&format!("{base};Application Name={name}")).map(|named| {
            named
                .with_lock_timeout(self.lock_timeout)
                .with_statement_timeout(self.statement_timeout)
        })
    }

    /// A pool of at most `max_size` sessions (the stores also open dedicated,
    /// unpooled connections through it, with `Pool::dedicated_connection`, for
    /// installs and locks). Each session is checked when it is taken from the pool
    /// ([`MssqlManager`]): a transaction left open is rolled back there;
    /// `IMPLICIT_TRANSACTIONS`, the isolation level and `XACT_ABORT` are set back to the
    /// login defaults (`OFF`, READ COMMITTED, `OFF`); `LOCK_TIMEOUT` is set to
    /// [`lock_timeout`](Self::lock_timeout); the ANSI options, `ARITHABORT`,
    /// `NUMERIC_ROUNDABORT`, `NOCOUNT`, `ROWCOUNT` and `TEXTSIZE` get the values the
    /// crate's statements need; and a session that does not answer is replaced. A
    /// session whose [`MssqlTransaction`](crate::MssqlTransaction) was dropped before it
    /// ended is closed instead of being pooled again.
    ///
    /// One connection is opened before this returns (and kept open), so a wrong address
    /// or password is reported here; later connection failures, which bb8 retries until
    /// its connection timeout, are logged (`tracing`, warn) with their cause.
    ///
    /// # Errors
    /// Mapped driver errors when the first connection cannot be opened.
    pub async fn pool(&self, max_size: u32) -> Result<MssqlPool> {
        bb8::Pool::builder()
            .max_size(max_size.max(1))
            .min_idle(Some(1))
            .test_on_check_out(true)
            .error_sink(Box::new(LogErrors))
            .build(self.manager())
            .await
            .map_err(|e| in_context("open the SQL Server pool", e))
    }

    /// A pool like [`pool`](Self::pool)'s that opens no connection until a store first
    /// needs one: for tools that may never reach the server (printing DDL) and should
    /// report an unreachable server where they use it.
    pub fn lazy_pool(&self, max_size: u32) -> MssqlPool {
        bb8::Pool::builder()
            .max_size(max_size.max(1))
            .test_on_check_out(true)
            .error_sink(Box::new(LogErrors))
            .build_unchecked(self.manager())
    }

    /// The pool's connection manager for this connection.
    pub fn manager(&self) -> MssqlManager {
        MssqlManager::new(self.config.clone())
            .with_lock_timeout(self.lock_timeout)
            .with_statement_timeout(self.statement_timeout)
    }

    /// One connection outside any pool, closed when dropped (no check-out statement
    /// runs on it: it has the login's settings).
    ///
    /// # Errors
    /// Mapped driver errors.
    pub async fn connect(&self) -> Result<MssqlClient> {
        self.manager()
            .connect()
            .await
            .map(crate::MssqlSession::into_client)
    }
}

impl fmt::Debug for MssqlConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self
            .pairs
            .iter()
            .map(|(key, value)| {
                if SHOWN_KEYS.contains(&key.to_ascii_lowercase().as_str()) {
                    format!("{key}={value}")
                } else {
                    format!("{key}=<redacted>")
                }
            })
            .collect();
        f.debug_struct("MssqlConnection")
            .field("ado", &shown.join(";"))
            .field("lock_timeout", &self.lock_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

/// The `key=value` pairs of an ADO.NET connection string, split exactly where
/// tiberius's parser (the `connection-string` crate) splits them, so that `Debug` can
/// never show part of a password as the value of another key. Like that parser: `"..."`,
/// `'...'` and `{...}` are escaped runs wherever they start (inside a key or a value,
/// not only at a value's start), and `;` and `=` inside them are literal; outside them,
/// `;` ends a pair and `=` separates key from value (a second `=` is an error); spaces
/// before a key or value are dropped, trailing ones trimmed, line breaks ignored. A
/// doubled quote inside a quoted run is a literal quote.
fn ado_pairs(ado: &str) -> Result<Vec<(String, String)>> {
    let bad = |why: &str| {
        Error::config(format!(
            "the SQL Server connection string does not parse: {why}"
        ))
    };
    #[derive(PartialEq)]
    enum Token {
        Semi,
        Eq,
        Text(String),
        Space,
    }
    let mut tokens = Vec::new();
    let mut chars = ado.chars().peekable();
    while let Some(c) = chars.next() {
        tokens.push(match c {
            quote @ ('"' | '\'') => {
                let mut run = String::new();
                loop {
                    match chars.next() {
                        None => return Err(bad("a quoted value is not closed")),
                        // As tiberius's lexer: a doubled quote is literal unless the
                        // run is still empty (then the run ends at the first quote).
                        Some(q) if q == quote && chars.peek() == Some(&quote) => {
                            if run.is_empty() {
                                break;
                            }
                            chars.next();
                            run.push(quote);
                        }
                        Some(q) if q == quote => break,
                        Some(c) => run.push(c),
                    }
                }
                Token::Text(run)
            }
            '{' => {
                let mut run = String::new();
                loop {
                    match chars.next() {
                        None => return Err(bad("a braced value is not closed")),
                        Some('}') => break,
                        Some(c) => run.push(c),
                    }
                }
                Token::Text(run)
            }
            ';' => Token::Semi,
            '=' => Token::Eq,
            '\n' => continue,
            ' ' => Token::Space,
            c => Token::Text(c.to_string()),
        });
    }
    // A key or a value: text and spaces from `at` up to `;`, `=` or the end; returns
    // it and the index of the token that ended it.
    let ident = |mut at: usize| {
        let mut out = String::new();
        while let Some(token) = tokens.get(at) {
            match token {
                Token::Semi | Token::Eq => break,
                Token::Text(text) => out.push_str(text),
                Token::Space if !out.is_empty() => out.push(' '),
                Token::Space => {}
            }
            at += 1;
        }
        (out.trim_end().to_owned(), at)
    };
    let mut pairs = Vec::new();
    let mut at = 0;
    if tokens.is_empty() {
        return Ok(pairs);
    }
    loop {
        let (key, end) = ident(at);
        if key.is_empty() {
            return Err(bad("a key is empty"));
        }
        if tokens.get(end) != Some(&Token::Eq) {
            return Err(bad("a key has no value"));
        }
        let (value, end) = ident(end + 1);
        pairs.push((key, value));
        match tokens.get(end) {
            // The end, or a `;` that ends the string.
            None => return Ok(pairs),
            Some(Token::Semi) if end + 1 == tokens.len() => return Ok(pairs),
            Some(Token::Semi) => at = end + 1,
            Some(_) => return Err(bad("a value holds an unescaped =")),
        }
    }
}

/// Logs the connection errors bb8 retries, which it would otherwise drop: a `get` that
/// cannot connect ends in a bare time-out.
#[derive(Debug, Clone, Copy)]
struct LogErrors;

impl bb8::ErrorSink<Error> for LogErrors {
    fn sink(&self, error: Error) {
        tracing::warn!(error = %error.report(), "SQL Server pool connection failed; retrying");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<Error>> {
        Box::new(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn ado_strings_parse_with_quotes_and_escapes() {
        let pairs =
            ado_pairs(" Server = tcp:h,1433 ; Password='a;b''c' ;User ID=\"x\"\"y\";k={v;=w};")
                .unwrap();
        assert_eq!(
            pairs,
            vec![
                ("Server".to_owned(), "tcp:h,1433".to_owned()),
                ("Password".to_owned(), "a;b'c".to_owned()),
                ("User ID".to_owned(), "x\"y".to_owned()),
                ("k".to_owned(), "v;=w".to_owned()),
            ]
        );
        assert!(ado_pairs("").unwrap().is_empty());
        for bad in [
            "server",
            "=x",
            "password='open",
            "password={open",
            "k=a=b",
            "a=b;;c=d",
        ] {
            assert!(ado_pairs(bad).is_err(), "{bad}");
        }
    }

    /// tiberius's parser treats quotes and braces as escapes wherever they start; a
    /// parser that split these strings at the inner `;` would show the password's tail
    /// as the value of `server`.
    #[test]
    fn debug_splits_where_the_driver_splits() {
        for ado in [
            "server=tcp:h,1;password={p1;server=LEAKED};user id=u",
            "server=tcp:h,1;password=p2\"x;server=LEAKED\"y;user id=u",
            "server=tcp:h,1;password=p3'x;server=LEAKED'y",
        ] {
            let conn = MssqlConnection::from_ado_string(ado).expect(ado);
            let shown = format!("{conn:?}");
            assert!(!shown.contains("LEAKED"), "{shown}");
            assert!(shown.contains("password=<redacted>"), "{shown}");
        }
        assert_eq!(
            ado_pairs("password=p2\"x;server=LEAKED\"y").unwrap(),
            vec![("password".to_owned(), "p2x;server=LEAKEDy".to_owned())]
        );
    }

    #[test]
    fn debug_redacts_secrets_and_unknown_keys() {
        let conn = MssqlConnection::from_ado_string(
            "server=tcp:db,1433;database=app;user id=svc;password=S3cret!;pwd=Other;\
             TrustServerCertificate=true;Some Future Key=hidden",
        )
        .unwrap();
        let shown = format!("{conn:?}");
        for secret in ["S3cret!", "Other", "hidden"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        for visible in [
            "server=tcp:db,1433",
            "database=app",
            "user id=svc",
            "password=<redacted>",
            "pwd=<redacted>",
            "TrustServerCertificate=true",
        ] {
            assert!(shown.contains(visible), "{visible} in {shown}");
        }
    }

    #[test]
    fn bad_strings_are_config_errors_that_do_not_quote_the_password() {
        let err =
            MssqlConnection::from_ado_string("server=tcp:h;password='never closed").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(!format!("{}", err.report()).contains("never closed"));
        let named = MssqlConnection::from_ado_string("server=tcp:h,1;password=x")
            .unwrap()
            .with_application_name("obx tests")
            .unwrap();
        assert!(format!("{named:?}").contains("Application Name=obx tests"));
        assert!(MssqlConnection::from_ado_string("server=tcp:h,1")
            .unwrap()
            .with_application_name("a;b")
            .is_err());
        // A string ending with `;` takes a name too (tiberius refuses `;;`).
        let trailing = MssqlConnection::from_ado_string("server=tcp:h,1;password=x;")
            .unwrap()
            .with_application_name("obx")
            .unwrap();
        assert!(format!("{trailing:?}").contains("Application Name=obx"));
    }
}
