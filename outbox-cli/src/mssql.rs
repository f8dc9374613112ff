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
    let mut pairs = vec![
        ("Server", format!("tcp:{host},{port}")),
        ("Database", decode(database)),
    ];
    if user.is_empty() {
        pairs.push(("Integrated Security", "true".to_owned()));
    } else {
        pairs.push(("User Id", user));
        pairs.push(("Password", password));
    }
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
        assert_eq!(
            ado_string("sqlserver://db/orders").unwrap(),
            "Server=tcp:db,1433;Database=orders;Integrated Security=true"
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
