//! Which database a URL names, and how to print it without its password.

use std::path::PathBuf;

use url::Url;

use crate::dynamo::DynamoTarget;
use crate::fail::Failure;

/// The database a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A PostgreSQL server; the URL as given (sqlx parses it).
    Postgres { url: String },
    /// An SQLite database file.
    Sqlite { path: PathBuf },
    /// DynamoDB tables at an endpoint.
    Dynamo(DynamoTarget),
    /// A SQL Server database, as the ADO.NET connection string the URL makes.
    Mssql { ado: String },
    /// A MySQL or MariaDB server; the URL as given, `mariadb://` read as `mysql://`.
    MySql { url: String },
}

impl Target {
    /// Read a URL: `postgres://` / `postgresql://`, `sqlite://PATH` / `sqlite:PATH`,
    /// `dynamodb://HOST:PORT` / `dynamodb+https://HOST` / `dynamodb://aws`,
    /// `sqlserver://USER:PASSWORD@HOST[:PORT]/DATABASE` / `mssql://...`,
    /// `mysql://USER:PASSWORD@HOST[:PORT]/DATABASE` / `mariadb://...`.
    ///
    /// # Errors
    /// A usage failure for what is not such a URL.
    pub(crate) fn parse(url: &str, secrets: &Secrets) -> Result<Target, Failure> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(
                Failure::usage(format!("`{}` is not a database URL", secrets.redact(url))).hint(
                    "use postgres://user:password@host:port/db, sqlite://path/to/file.db, \
                         mysql://user:password@host:port/db, \
                         sqlserver://user:password@host:port/db or dynamodb://host:port",
                ),
            );
        };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(Target::Postgres {
                url: url.to_owned(),
            }),
            "sqlite" => {
                let rest = rest.strip_prefix("//").unwrap_or(rest);
                let path = rest.split_once('?').map_or(rest, |(path, _)| path);
                if path.is_empty() || path == ":memory:" {
                    return Err(Failure::usage(format!("`{url}` names no database file"))
                        .hint("use sqlite://path/to/file.db (relative) or sqlite:///abs/path.db"));
                }
                Ok(Target::Sqlite {
                    path: PathBuf::from(path),
                })
            }
            "dynamodb" | "dynamodb+https" => DynamoTarget::parse(scheme, rest).map(Target::Dynamo),
            "mssql" | "sqlserver" => Ok(Target::Mssql {
                ado: crate::mssql::ado_string(url)?,
            }),
            "mysql" | "mariadb" => Ok(Target::MySql {
                url: format!("mysql:{rest}"),
            }),
            other => Err(
                Failure::usage(format!("unknown database URL scheme `{other}`"))
                    .hint("use postgres://, postgresql://, sqlite://, mysql://, mariadb://, sqlserver:// or dynamodb://"),
            ),
        }
    }
}

/// The secrets a URL carries, to be blanked out of everything printed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Secrets(Vec<String>);

/// What a secret is replaced with.
const MASK: &str = "***";

impl Secrets {
    /// The password of `url` and any `password=` query parameter, each as written and
    /// decoded. None for a URL without them (`sqlite:` paths hold no password).
    pub(crate) fn of_url(url: &str) -> Secrets {
        let url = url.trim();
        let mut raw: Vec<&str> = Vec::new();
        // By hand as well as through `Url`, so a URL too broken to parse still has its
        // password blanked in the error saying so.
        if let Some((_, rest)) = url.split_once("://") {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                raw.extend(userinfo.split_once(':').map(|(_, password)| password));
            }
        }
        if let Some((_, query)) = url.split_once('?') {
            for pair in query.split(['&', '#']) {
                if let Some((key, value)) = pair.split_once('=') {
                    if key.eq_ignore_ascii_case("password") {
                        raw.push(value);
                    }
                }
            }
        }
        let parsed = Url::parse(url).ok();
        raw.extend(parsed.as_ref().and_then(Url::password));
        let mut secrets: Vec<String> = Vec::new();
        for secret in raw {
            secrets.push(secret.to_owned());
            secrets.extend(percent_decode(secret));
            secrets.extend(percent_decode(&secret.replace('+', " ")));
        }
        secrets.retain(|s| !s.is_empty());
        // Longest first, so a secret containing another is blanked whole.
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Secrets(secrets)
    }

    /// Add `other`'s secrets.
    pub(crate) fn extend(&mut self, other: Secrets) {
        self.0.extend(other.0);
        self.0
            .sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.0.dedup();
    }

    /// `text` with every secret replaced by `***`.
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.0 {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), MASK);
            }
        }
        text
    }
}

/// `text` with its `%XX` escapes decoded, if that makes UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fail::Exit;

    fn parse(url: &str) -> Result<Target, Failure> {
        Target::parse(url, &Secrets::of_url(url))
    }

    #[test]
    fn schemes_pick_the_backend() {
        for url in [
            "postgres://u@h/db",
            "postgresql://u:p@h:5433/db?sslmode=disable",
        ] {
            assert_eq!(
                parse(url).unwrap(),
                Target::Postgres {
                    url: url.to_owned()
                }
            );
        }
        for (url, path) in [
            ("sqlite://data/app.db", "data/app.db"),
            ("sqlite:///tmp/app.db", "/tmp/app.db"),
            ("sqlite:app.db", "app.db"),
            ("SQLITE://app.db?mode=rwc", "app.db"),
        ] {
            assert_eq!(
                parse(url).unwrap(),
                Target::Sqlite {
                    path: PathBuf::from(path)
                },
                "{url}"
            );
        }
    }

    #[test]
    fn sql_server_urls_become_ado_strings_and_unknown_schemes_are_usage() {
        for url in [
            "mssql://sa:pw@localhost/db",
            "SQLSERVER://sa:pw@localhost/db",
        ] {
            assert_eq!(
                parse(url).unwrap(),
                Target::Mssql {
                    ado: "Server=tcp:localhost,1433;Database=db;User Id=sa;Password=pw".into()
                },
                "{url}"
            );
        }
        for url in ["mysql://u:p@h:3306/db", "MariaDB://u@h/db"] {
            let rest = url.split_once(':').unwrap().1;
            assert_eq!(
                parse(url).unwrap(),
                Target::MySql {
                    url: format!("mysql:{rest}")
                },
                "{url}"
            );
        }
        for bad in [
            "oracle://h/db",
            "just-a-path.db",
            "sqlite://",
            "sqlite::memory:",
        ] {
            assert_eq!(parse(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
    }

    #[test]
    fn passwords_are_redacted_as_written_and_decoded() {
        let url = "postgres://app:s%40cr%2Ft@db.internal:5432/orders?password=other";
        let secrets = Secrets::of_url(url);
        let text = format!("failed: {url} (s@cr/t, other)");
        let redacted = secrets.redact(&text);
        for secret in ["s%40cr%2Ft", "s@cr/t", "other"] {
            assert!(!redacted.contains(secret), "{redacted}");
        }
        assert!(
            redacted.contains("postgres://app:***@db.internal:5432/orders"),
            "{redacted}"
        );
        assert_eq!(
            Secrets::of_url("sqlite://a.db").redact("sqlite://a.db"),
            "sqlite://a.db"
        );
        let broken = "postgres://u:hunter2@[bad/db";
        assert!(!Secrets::of_url(broken).redact(broken).contains("hunter2"));
        assert_eq!(
            Secrets::of_url("postgres://u@h/db").redact("u h db"),
            "u h db"
        );
    }
}
