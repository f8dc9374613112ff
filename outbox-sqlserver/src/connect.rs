//! Connecting: [`MssqlConnection`] (an ADO.NET connection string whose `Debug` never
//! shows a secret) and the bb8 pool of tiberius clients.

use std::fmt;

use outbox_core::{Error, Result};

use crate::error::{from_connect, from_tiberius};

/// A tiberius client on a tokio TCP stream: the connection type of [`MssqlPool`], and
/// the client your own transactions run on when you pass it to
/// [`MssqlOutbox::enqueue`](crate::MssqlOutbox::enqueue).
pub type MssqlClient = bb8_tiberius::rt::Client;

/// A bb8 pool of [`MssqlClient`]s.
pub type MssqlPool = bb8::Pool<MssqlManager>;

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
        })
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
        Self::from_ado_string(&format!("{base};Application Name={name}"))
    }

    /// A pool of at most `max_size` connections (the stores also open dedicated,
    /// unpooled connections through it, with `Pool::dedicated_connection`, for
    /// installs and locks). Each connection is checked when it is
    /// taken from the pool: a transaction a dropped caller left open is rolled back
    /// there, `IMPLICIT_TRANSACTIONS`, the isolation level and `XACT_ABORT` are set back
    /// to the login defaults (`OFF`, READ COMMITTED, `OFF`), and a connection that does
    /// not answer is replaced.
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
            .build(MssqlManager::new(self.config.clone()))
            .await
            .map_err(|e| from_connect("open the SQL Server pool", e))
    }

    /// One connection outside any pool, closed when dropped.
    ///
    /// # Errors
    /// Mapped driver errors.
    pub async fn connect(&self) -> Result<MssqlClient> {
        use bb8::ManageConnection;
        MssqlManager::new(self.config.clone())
            .connect()
            .await
            .map_err(|e| from_connect("connect to SQL Server", e))
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
        f.debug_tuple("MssqlConnection")
            .field(&shown.join(";"))
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

impl bb8::ErrorSink<bb8_tiberius::Error> for LogErrors {
    fn sink(&self, error: bb8_tiberius::Error) {
        let err = from_connect("connect to SQL Server", error);
        tracing::warn!(error = %err.report(), "SQL Server pool connection failed; retrying");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<bb8_tiberius::Error>> {
        Box::new(*self)
    }
}

/// The pool's connection manager: bb8-tiberius's, plus a check-out test that rolls back
/// a transaction left open on the connection (a caller's future dropped between `BEGIN
/// TRAN` and `COMMIT`) and replaces a connection that no longer answers, for example
/// one whose stream a dropped query left half read.
pub struct MssqlManager {
    inner: bb8_tiberius::ConnectionManager,
}

impl MssqlManager {
    /// A manager connecting with `config`.
    pub fn new(config: tiberius::Config) -> Self {
        MssqlManager {
            inner: bb8_tiberius::ConnectionManager::new(config),
        }
    }
}

impl fmt::Debug for MssqlManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlManager").finish_non_exhaustive()
    }
}

/// Begins the crate's own transactions (consumer `process`), sent as a plain batch:
/// through `sp_executesql` a changed transaction count would raise error 266.
pub(crate) const BEGIN: &str = "BEGIN TRANSACTION";
/// Commits them.
pub(crate) const COMMIT: &str = "COMMIT TRANSACTION";
/// Rolls back whatever is open, on error paths.
pub(crate) const ROLLBACK_IF_OPEN: &str = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION";

/// Run on every connection taken from the pool: roll back a transaction left open, and
/// put back the session settings the crate's statements rely on. The pool is shared
/// with callers' own transactions (see the README), and tiberius has no
/// `sp_reset_connection`: a caller that left `SET TRANSACTION ISOLATION LEVEL
/// SERIALIZABLE` (key-range locks) or `SNAPSHOT` (where `READPAST` without `HOLDLOCK`
/// fails with error 650) on a connection, or `IMPLICIT_TRANSACTIONS ON` (a claim would
/// then keep its locks in a transaction nobody commits), would otherwise change how the
/// next claim or settle on that connection behaves.
pub(crate) const CHECK_OUT: &str = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; \
     SET IMPLICIT_TRANSACTIONS OFF; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     SET XACT_ABORT OFF; SELECT 1 AS ok";

impl bb8::ManageConnection for MssqlManager {
    type Connection = MssqlClient;
    type Error = bb8_tiberius::Error;

    async fn connect(&self) -> std::result::Result<Self::Connection, Self::Error> {
        self.inner.connect().await
    }

    async fn is_valid(&self, conn: &mut Self::Connection) -> std::result::Result<(), Self::Error> {
        conn.simple_query(CHECK_OUT).await?.into_results().await?;
        Ok(())
    }

    fn has_broken(&self, _conn: &mut Self::Connection) -> bool {
        false
    }
}

/// A dedicated connection from `pool`'s manager: not pooled, closed when dropped.
pub(crate) async fn dedicated(pool: &MssqlPool, what: &str) -> Result<MssqlClient> {
    pool.dedicated_connection()
        .await
        .map_err(|e| from_connect(what, e))
}

/// Roll back whatever transaction `client` has open, ignoring errors: used on error
/// paths of the crate's own transactions, before the connection is dropped or pooled.
pub(crate) async fn rollback_quietly(client: &mut MssqlClient) {
    if let Err(e) = client.simple_query(ROLLBACK_IF_OPEN).await {
        let err = from_tiberius("roll back", e);
        tracing::debug!(error = %err.report(), "rollback failed; the pool replaces the connection");
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
