//! The one place where tiberius and pool errors become [`outbox_core::Error`]s.
//!
//! Server errors are classified by their SQL Server error number. The numbers were
//! checked against Microsoft's documentation:
//!
//! - 1205 (`LK_VICTIM`, "chosen as the deadlock victim. Rerun the transaction"): the
//!   `MSSQLSERVER_1205` page of the Database Engine errors reference.
//! - 1222 ("Lock request time out period exceeded", raised when `LOCK_TIMEOUT`
//!   elapses; the pool sets one on every check-out) and 1204 ("cannot obtain a LOCK
//!   resource at this time"): the "Customizing the lock time-out" page and
//!   Microsoft.Data.SqlClient's `SqlConfigurableRetryFactory` transient list.
//! - 40197, 40501, 40613, 49918, 49919, 49920, 4221, 615, 926, and 4060 on Azure SQL:
//!   Azure SQL's "List of transient fault error codes" (*Troubleshooting connectivity
//!   issues and other errors*); 10928 / 10929 (resource limits) and 40540 from the
//!   same family, as retried by EF's `SqlAzureExecutionStrategy`.
//! - 40549, 40550, 40551 (session terminated for a long-running transaction, too many
//!   locks, too much `tempdb`): Azure SQL's resource-governance errors; the work may
//!   succeed on a new session, ideally in smaller transactions.
//! - 976 and 983 (an availability database not accessible, a replica in neither role)
//!   and 3906 (database read-only, as an old primary is after a failover): the
//!   Database Engine errors reference; they last as long as a failover does.
//! - 701 (insufficient system memory) and 8645 (time-out waiting for memory to run a
//!   query): the Database Engine errors reference; memory pressure passes.
//! - 4060 ("Cannot open database requested by the login") is transient on Azure SQL
//!   (a database moving during reconfiguration), and a wrong database name or a
//!   missing permission anywhere else; 18456 (login failed) is a wrong user, password
//!   or authentication setting. Both are configuration errors unless the server is
//!   Azure SQL ([`Platform`]).
//! - 3960 (snapshot isolation update conflict) is not produced by this crate's
//!   statements, which run at READ COMMITTED; it is still mapped as contention for
//!   callers' `SNAPSHOT` transactions.
//! - 2627 (violation of a PRIMARY KEY or UNIQUE constraint) and 2601 (duplicate key
//!   row in a unique index): the Database Engine errors reference, 2000-2999.
//! - 208 (invalid object name), 207 (invalid column name), 2812 (could not find stored
//!   procedure), 2760 (specified schema name does not exist).
//! - 1069 (index hints only in a FROM or OPTION clause), 308 (a hinted index does not
//!   exist), 315 (a hinted index is disabled or offline), 8622 (no plan can honour the
//!   hints) and 334 (`OUTPUT` without `INTO` on a table with an enabled trigger): the
//!   statement does not fit the table as it is (an index renamed or dropped, a trigger
//!   added), so retrying cannot help.
//! - 596 (the session is being killed) and 6005 (the server is shutting down): a new
//!   session succeeds once the server is back. 8628 (time-out waiting to optimise) and
//!   8651 (a memory grant was not available): the Database Engine errors reference;
//!   pressure passes. 42108 and 42109 (an Azure serverless pool paused or resuming):
//!   Azure's serverless troubleshooting page; it resumes on the next connection.
//! - 3930 (the transaction is doomed: it cannot commit or write to the log) is not
//!   retryable where it is met, only after the caller rolls its transaction back.
//!
//! Client-side numbers of other drivers (SqlClient's 20, 64, 233, and the Winsock
//! 10053/10054/10060) are not listed: the server never sends them, and tiberius reports
//! a lost connection as an I/O error, mapped by its variant below.
//!
//! Driver errors are classified by their tiberius variant; the cause stays reachable
//! through [`std::error::Error::source`], never in the message.

use outbox_core::{Error, ErrorKind};

/// Where the server runs, for the error numbers whose meaning depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Platform {
    /// Azure SQL Database or Managed Instance (and Fabric SQL databases), recognised by
    /// the host name's domain.
    AzureSql,
    /// Any other server, or one whose host name does not say.
    SqlServer,
}

/// DNS suffixes of Azure SQL endpoints (public clouds and their private links).
const AZURE_SUFFIXES: &[&str] = &[
    ".database.windows.net",
    ".database.chinacloudapi.cn",
    ".database.usgovcloudapi.net",
    ".database.fabric.microsoft.com",
];

impl Platform {
    /// The platform of a server reached at `host` (a name or address, without port).
    /// A custom DNS name for an Azure SQL server reads as [`Platform::SqlServer`], so
    /// its error 4060 is a configuration error.
    pub(crate) fn of_host(host: &str) -> Platform {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if AZURE_SUFFIXES.iter().any(|suffix| host.ends_with(suffix)) {
            Platform::AzureSql
        } else {
            Platform::SqlServer
        }
    }

    /// The platform of the server `config` connects to.
    pub(crate) fn of_config(config: &tiberius::Config) -> Platform {
        let addr = config.get_addr();
        let host = addr
            .rsplit_once(':')
            .map_or(addr.as_str(), |(host, _)| host);
        Platform::of_host(host)
    }
}

/// The kind for a SQL Server error number on `platform`; its retryable status is the
/// kind's [`default_status`](ErrorKind::default_status).
///
/// | number | condition | kind |
/// |---|---|---|
/// | 1205 | deadlock victim | Contention |
/// | 1222 | lock request time-out (`LOCK_TIMEOUT`) | Contention |
/// | 1204 | cannot obtain a LOCK resource | Contention |
/// | 3960 | snapshot isolation update conflict | Contention |
/// | 40501 | service busy (throttling) | Contention |
/// | 10928, 10929 | resource limit reached / server too busy | Contention |
/// | 49918, 49919, 49920 | not enough resources / too many operations | Contention |
/// | 40549, 40550, 40551 | session ended: long transaction, too many locks, `tempdb` | Contention |
/// | 701, 8645 | insufficient memory / time-out waiting for query memory | Contention |
/// | 8628, 8651 | time-out waiting to optimise / memory grant not available | Contention |
/// | 596, 6005 | session being killed / server shutting down | Unavailable |
/// | 42108, 42109 | Azure serverless pool paused / resuming | Unavailable |
/// | 40613 | database not currently available | Unavailable |
/// | 40197, 40540 | service error processing the request (failover) | Unavailable |
/// | 4221, 615, 926 | replica or database briefly unavailable during reconfiguration | Unavailable |
/// | 976, 983 | availability database not accessible / replica in neither role | Unavailable |
/// | 3906 | database read-only (an old primary after a failover) | Unavailable |
/// | 4060 on Azure SQL | cannot open database (reconfiguration) | Unavailable |
/// | 4060 elsewhere | cannot open database (name or permission) | Config |
/// | 18456 | login failed | Config |
/// | 2627, 2601 | unique constraint / unique index violation | Conflict |
/// | 515, 547, 8152, 2628, 8114, 8115, 245, 220 | NULL, constraint, truncation, conversion, overflow | InvalidInput |
/// | 208, 207, 2812, 2760 | missing object, column, procedure or schema | Schema |
/// | 1069, 308, 315, 8622, 334 | hints or `OUTPUT` the table refuses | Schema |
/// | anything else | | Storage |
pub(crate) fn kind_for_number(number: u32, platform: Platform) -> ErrorKind {
    match number {
        1205 | 1222 | 1204 | 3960 | 40501 | 10928 | 10929 | 49918 | 49919 | 49920 | 40549
        | 40550 | 40551 | 701 | 8645 | 8628 | 8651 => ErrorKind::Contention,
        40613 | 40197 | 40540 | 4221 | 615 | 926 | 976 | 983 | 3906 | 596 | 6005 | 42108
        | 42109 => ErrorKind::Unavailable,
        4060 if platform == Platform::AzureSql => ErrorKind::Unavailable,
        4060 | 18456 => ErrorKind::Config,
        2627 | 2601 => ErrorKind::Conflict,
        515 | 547 | 8152 | 2628 | 8114 | 8115 | 245 | 220 => ErrorKind::InvalidInput,
        208 | 207 | 2812 | 2760 | 1069 | 308 | 315 | 8622 | 334 => ErrorKind::Schema,
        _ => ErrorKind::Storage,
    }
}

/// What to do about the numbers whose cure is not in the statement: appended to the
/// message.
pub(crate) fn advice(number: u32) -> Option<&'static str> {
    match number {
        308 | 315 | 8622 => Some(
            "the statement's index hints name an index of the table that is missing, \
             disabled or unusable: install the table again, or compare its indexes with \
             the crate's DDL",
        ),
        1069 => Some("an index hint stands where SQL Server refuses it: a defect of this crate"),
        334 => Some(
            "the table has an enabled trigger, and the crate's statements return rows with \
             OUTPUT without INTO: disable or drop the trigger on the outbox tables",
        ),
        3930 => Some("the transaction is doomed: roll it back, then retry it whole"),
        _ => None,
    }
}

/// Map a tiberius error met while running a statement for `what` (for example
/// `"claim"`) to the workspace error, keeping the tiberius error as the source. A
/// statement's error is mapped as on [`Platform::SqlServer`]: the one number whose
/// meaning differs, 4060, is a login error, which [`from_connect`] maps.
pub(crate) fn from_tiberius(what: &str, err: tiberius::error::Error) -> Error {
    from_tiberius_on(what, err, Platform::SqlServer)
}

/// [`from_tiberius`] for an error met on `platform`.
pub(crate) fn from_tiberius_on(
    what: &str,
    err: tiberius::error::Error,
    platform: Platform,
) -> Error {
    use tiberius::error::Error as E;
    let (kind, message) = match &err {
        E::Server(token) => (
            kind_for_number(token.code(), platform),
            match advice(token.code()) {
                Some(advice) => format!(
                    "{what} failed (SQL Server error {}: {advice})",
                    token.code()
                ),
                None => format!("{what} failed (SQL Server error {})", token.code()),
            },
        ),
        E::Io { .. } | E::Tls(_) | E::Protocol(_) | E::Routing { .. } => {
            (ErrorKind::Unavailable, format!("{what} failed"))
        }
        E::Conversion(_) | E::Utf8 | E::Utf16 | E::ParseInt(_) | E::Encoding(_) => {
            (ErrorKind::Decode, format!("{what} failed"))
        }
        E::BulkInput(_) => (ErrorKind::InvalidInput, format!("{what} failed")),
        #[allow(unreachable_patterns)]
        _ => (ErrorKind::Storage, format!("{what} failed")),
    };
    Error::new(kind, message)
        .with_status(kind.default_status())
        .with_source(err)
}

/// Map an error of connecting (bb8-tiberius's manager) to a server on `platform`,
/// met while doing `what`.
pub(crate) fn from_connect(what: &str, err: bb8_tiberius::Error, platform: Platform) -> Error {
    match err {
        bb8_tiberius::Error::Tiberius(e) => from_tiberius_on(what, e, platform),
        bb8_tiberius::Error::Io(e) => {
            Error::new(ErrorKind::Unavailable, format!("{what} failed")).with_source(e)
        }
    }
}

/// `err` (already mapped, by the pool's manager) as the cause of failing to do `what`:
/// same kind and status, this layer's message.
pub(crate) fn in_context(what: &str, err: Error) -> Error {
    Error::new(err.kind(), format!("{what} failed"))
        .with_status(err.status())
        .with_source(err)
}

/// Map an error of taking a connection from the pool met while doing `what`.
pub(crate) fn from_pool(what: &str, err: bb8::RunError<Error>) -> Error {
    match err {
        bb8::RunError::User(e) => in_context(what, e),
        bb8::RunError::TimedOut => Error::new(
            ErrorKind::Timeout,
            format!("{what} failed: timed out waiting for a pooled connection"),
        ),
    }
}

/// Whether `err` is a server error with one of these numbers.
pub(crate) fn has_number(err: &tiberius::error::Error, numbers: &[u32]) -> bool {
    err.code().is_some_and(|code| numbers.contains(&code))
}

/// A decode error for rows of an unexpected shape.
pub(crate) fn decode_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Decode, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorStatus;
    use std::error::Error as _;

    use Platform::{AzureSql, SqlServer};

    /// Every number the Microsoft pages name, with its kind on each platform and
    /// whether a caller should retry it on SQL Server: `(number, on SQL Server, on
    /// Azure SQL, retry)`.
    const TABLE: &[(u32, ErrorKind, ErrorKind, bool)] = &[
        (1205, ErrorKind::Contention, ErrorKind::Contention, true),
        (1222, ErrorKind::Contention, ErrorKind::Contention, true),
        (1204, ErrorKind::Contention, ErrorKind::Contention, true),
        (3960, ErrorKind::Contention, ErrorKind::Contention, true),
        (40501, ErrorKind::Contention, ErrorKind::Contention, true),
        (10928, ErrorKind::Contention, ErrorKind::Contention, true),
        (10929, ErrorKind::Contention, ErrorKind::Contention, true),
        (49918, ErrorKind::Contention, ErrorKind::Contention, true),
        (49919, ErrorKind::Contention, ErrorKind::Contention, true),
        (49920, ErrorKind::Contention, ErrorKind::Contention, true),
        (40549, ErrorKind::Contention, ErrorKind::Contention, true),
        (40550, ErrorKind::Contention, ErrorKind::Contention, true),
        (40551, ErrorKind::Contention, ErrorKind::Contention, true),
        (701, ErrorKind::Contention, ErrorKind::Contention, true),
        (8645, ErrorKind::Contention, ErrorKind::Contention, true),
        (8628, ErrorKind::Contention, ErrorKind::Contention, true),
        (8651, ErrorKind::Contention, ErrorKind::Contention, true),
        (596, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (6005, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (42108, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (42109, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (1069, ErrorKind::Schema, ErrorKind::Schema, false),
        (308, ErrorKind::Schema, ErrorKind::Schema, false),
        (315, ErrorKind::Schema, ErrorKind::Schema, false),
        (8622, ErrorKind::Schema, ErrorKind::Schema, false),
        (334, ErrorKind::Schema, ErrorKind::Schema, false),
        (3930, ErrorKind::Storage, ErrorKind::Storage, false),
        (40613, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (40197, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (40540, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (4221, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (615, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (926, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (976, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (983, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (3906, ErrorKind::Unavailable, ErrorKind::Unavailable, true),
        (4060, ErrorKind::Config, ErrorKind::Unavailable, false),
        (18456, ErrorKind::Config, ErrorKind::Config, false),
        (2627, ErrorKind::Conflict, ErrorKind::Conflict, false),
        (2601, ErrorKind::Conflict, ErrorKind::Conflict, false),
        (515, ErrorKind::InvalidInput, ErrorKind::InvalidInput, false),
        (547, ErrorKind::InvalidInput, ErrorKind::InvalidInput, false),
        (
            8152,
            ErrorKind::InvalidInput,
            ErrorKind::InvalidInput,
            false,
        ),
        (
            2628,
            ErrorKind::InvalidInput,
            ErrorKind::InvalidInput,
            false,
        ),
        (
            8114,
            ErrorKind::InvalidInput,
            ErrorKind::InvalidInput,
            false,
        ),
        (
            8115,
            ErrorKind::InvalidInput,
            ErrorKind::InvalidInput,
            false,
        ),
        (245, ErrorKind::InvalidInput, ErrorKind::InvalidInput, false),
        (220, ErrorKind::InvalidInput, ErrorKind::InvalidInput, false),
        (208, ErrorKind::Schema, ErrorKind::Schema, false),
        (207, ErrorKind::Schema, ErrorKind::Schema, false),
        (2812, ErrorKind::Schema, ErrorKind::Schema, false),
        (2760, ErrorKind::Schema, ErrorKind::Schema, false),
        (102, ErrorKind::Storage, ErrorKind::Storage, false),
        (50000, ErrorKind::Storage, ErrorKind::Storage, false),
        (0, ErrorKind::Storage, ErrorKind::Storage, false),
    ];

    #[test]
    fn error_number_table_entry_by_entry() {
        for &(number, on_premises, azure, retry) in TABLE {
            assert_eq!(kind_for_number(number, SqlServer), on_premises, "{number}");
            assert_eq!(
                kind_for_number(number, AzureSql),
                azure,
                "{number} on Azure"
            );
            let retryable = |kind: ErrorKind| kind.default_status() == ErrorStatus::Temporary;
            assert_eq!(retryable(on_premises), retry, "{number} retryable");
            // The one number whose meaning depends on the platform.
            assert_eq!(
                retryable(azure),
                retry || number == 4060,
                "{number} on Azure"
            );
        }
    }

    #[test]
    fn numbers_whose_cure_is_elsewhere_say_what_to_do() {
        for number in [308, 315, 8622, 1069, 334, 3930] {
            assert!(advice(number).is_some(), "{number}");
        }
        assert!(advice(334).unwrap().contains("trigger"));
        assert!(advice(3930).unwrap().contains("roll it back"));
        for number in [1205, 208, 0] {
            assert_eq!(advice(number), None, "{number}");
        }
    }

    #[test]
    fn client_side_numbers_are_not_in_the_table() {
        // SqlClient's and Winsock's numbers never arrive from the server: a lost
        // connection is an I/O error in tiberius (`driver_errors`).
        for number in [20, 64, 233, 10053, 10054, 10060] {
            assert_eq!(
                kind_for_number(number, SqlServer),
                ErrorKind::Storage,
                "{number}"
            );
        }
    }

    #[test]
    fn azure_sql_is_recognised_by_host_name() {
        for host in [
            "myserver.database.windows.net",
            "MyServer.Database.Windows.Net",
            "mi-1.abc123.database.windows.net",
            "srv.privatelink.database.windows.net",
            "srv.database.chinacloudapi.cn",
            "srv.database.usgovcloudapi.net",
            "x.database.fabric.microsoft.com",
            "myserver.database.windows.net.",
        ] {
            assert_eq!(Platform::of_host(host), AzureSql, "{host}");
        }
        for host in [
            "localhost",
            "127.0.0.1",
            "db.internal",
            "windows.net",
            "evil-database.windows.net.example",
        ] {
            assert_eq!(Platform::of_host(host), SqlServer, "{host}");
        }
        let mut config = tiberius::Config::new();
        config.host("srv.database.windows.net");
        config.port(1433);
        assert_eq!(Platform::of_config(&config), AzureSql);
        config.host("localhost");
        assert_eq!(Platform::of_config(&config), SqlServer);
    }

    #[test]
    fn driver_errors() {
        use tiberius::error::Error as E;
        let cases = [
            (
                E::Io {
                    kind: std::io::ErrorKind::ConnectionReset,
                    message: "reset".into(),
                },
                ErrorKind::Unavailable,
                true,
            ),
            (E::Protocol("eof".into()), ErrorKind::Unavailable, true),
            (E::Tls("handshake".into()), ErrorKind::Unavailable, true),
            (
                E::Routing {
                    host: "h".into(),
                    port: 1,
                },
                ErrorKind::Unavailable,
                true,
            ),
            (E::Conversion("bad".into()), ErrorKind::Decode, false),
            (E::Utf16, ErrorKind::Decode, false),
        ];
        for (err, kind, retryable) in cases {
            let text = err.to_string();
            let mapped = from_tiberius("claim", err);
            assert_eq!(mapped.kind(), kind, "{text}");
            assert_eq!(mapped.is_retryable(), retryable, "{text}");
            assert_eq!(mapped.message(), "claim failed");
            assert!(mapped.source().is_some());
        }
        let io = bb8_tiberius::Error::Io(std::io::Error::other("refused"));
        let mapped = from_connect("connect", io, Platform::SqlServer);
        assert_eq!(mapped.kind(), ErrorKind::Unavailable);
        assert!(mapped.is_retryable());
        let timed_out = from_pool("claim", bb8::RunError::TimedOut);
        assert_eq!(timed_out.kind(), ErrorKind::Timeout);
        assert!(timed_out.is_retryable());
        // A connect error the manager mapped keeps its kind and status in context.
        let refused = Error::new(ErrorKind::Config, "connect to SQL Server failed");
        let mapped = from_pool("claim", bb8::RunError::User(refused));
        assert_eq!(
            (mapped.kind(), mapped.is_retryable()),
            (ErrorKind::Config, false)
        );
        assert_eq!(mapped.message(), "claim failed");
        assert!(mapped.source().is_some());
        assert!(!has_number(&E::Utf8, &[2627]));
    }
}
