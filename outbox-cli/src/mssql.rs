//! `sqlserver://` URLs, turned into the ADO.NET connection string the SQL Server
//! backend takes.

use url::Url;

use crate::fail::Failure;

/// The port SQL Server listens on by default.
const DEFAULT_PORT: u16 = 1433;

/// The ADO.NET connection string a `sqlserver://` (or `mssql://`) URL names:
/// `sqlserver://user:password@host[:port]/database[?encrypt=..&trustServerCertificate=..]`.
/// User and password are percent-decoded; `encrypt` is `true`, `false` or `strict`.
pub(crate) fn ado_string(url: &str) -> Result<String, Failure> {
    let usage = |why: String| {
        Failure::usage(why).hint(
            "use sqlserver://user:password@host:1433/database, adding \
             ?trustServerCertificate=true for a server with a self-signed certificate",
        )
    };
    let parsed = Url::parse(url).map_err(|e| usage(format!("not a SQL Server URL: {e}")))?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| usage("the SQL Server URL names no host".to_owned()))?;
    let port = parsed.port().unwrap_or(DEFAULT_PORT);
    let database = parsed.path().trim_start_matches('/');
    if database.is_empty() || database.contains('/') {
        return Err(usage(
            "the SQL Server URL must name one database as its path".to_owned(),
        ));
    }
    let user = decode(parsed.username());
    let password = parsed.password().map(decode).unwrap_or_default();
    // Windows and Kerberos authentication are not compiled into the SQL Server driver
    // here: without a user it would try a SQL login with an empty name, and the server's
    // "login failed" would hide the cause.
    if user.is_empty() {
        return Err(usage(
            "the SQL Server URL names no user: this build signs in with SQL Server \
             authentication only (integrated security is not compiled in)"
                .to_owned(),
        ));
    }
    let mut pairs = vec![
        ("Server", format!("tcp:{host},{port}")),
        ("Database", decode(database)),
        ("User Id", user),
        ("Password", password),
    ];
    for (key, value) in parsed.query_pairs() {
        let key = key.to_ascii_lowercase();
        let value = value.to_ascii_lowercase();
        match (key.as_str(), value.as_str()) {
            ("encrypt", "true" | "false" | "strict") => pairs.push(("Encrypt", value)),
            ("trustservercertificate", "true" | "false") => {
                pairs.push(("TrustServerCertificate", value));
            }
            _ => {
                return Err(usage(format!(
                    "unknown or invalid SQL Server URL parameter `{key}={value}` \
                     (known: encrypt=true|false|strict, trustServerCertificate=true|false)"
                )))
            }
        }
    }
    Ok(pairs
        .into_iter()
        .map(|(key, value)| format!("{key}={}", quote(&value)))
        .collect::<Vec<_>>()
        .join(";"))
}

/// `text` with its `%XX` escapes decoded (as written when they do not make UTF-8).
fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map_or_else(|| text.to_owned(), |(_, v)| v.into_owned())
}

/// An ADO.NET value, in double quotes (inner ones doubled) when it holds a character
/// the string's syntax uses.
fn quote(value: &str) -> String {
    if value.contains([';', '=', '"', '\'', '{', '}'])
        || value.starts_with(' ')
        || value.ends_with(' ')
    {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fail::Exit;

    #[test]
    fn a_url_becomes_an_ado_string() {
        assert_eq!(
            ado_string("sqlserver://sa:s3cret@db.internal/orders").unwrap(),
            "Server=tcp:db.internal,1433;Database=orders;User Id=sa;Password=s3cret"
        );
        assert_eq!(
            ado_string(
                "mssql://app:p%40ss%3Bw%3Drd@127.0.0.1:14330/orders?encrypt=false&trustServerCertificate=true"
            )
            .unwrap(),
            "Server=tcp:127.0.0.1,14330;Database=orders;User Id=app;Password=\"p@ss;w=rd\";\
             Encrypt=false;TrustServerCertificate=true"
        );
    }

    #[test]
    fn a_url_without_a_user_is_refused_with_the_reason() {
        let refused = ado_string("sqlserver://db/orders").unwrap_err();
        assert_eq!(refused.exit, Exit::Usage);
        let text = format!("{refused:?}");
        assert!(text.contains("names no user"), "{text}");
        assert!(
            text.contains("integrated security is not compiled in"),
            "{text}"
        );
    }

    #[test]
    fn a_quote_in_a_value_is_doubled() {
        assert_eq!(quote("a\"b;c"), "\"a\"\"b;c\"");
        assert_eq!(quote("plain"), "plain");
    }

    #[test]
    fn bad_urls_are_usage_errors() {
        for url in [
            "sqlserver://sa:pw@host",
            "sqlserver://sa:pw@host/a/b",
            "sqlserver://sa:pw@host/db?encrypt=maybe",
            "sqlserver://sa:pw@host/db?colour=blue",
            "sqlserver:///db",
        ] {
            assert_eq!(ado_string(url).unwrap_err().exit, Exit::Usage, "{url}");
        }
    }
}
