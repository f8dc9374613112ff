//! `dynamodb://` URLs: where the DynamoDB tables are, and a client for them.

use std::time::Duration;

use outbox_dynamodb::aws_sdk_dynamodb;
use outbox_dynamodb::aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use outbox_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use outbox_dynamodb::aws_sdk_dynamodb::Client;

use crate::fail::Failure;

/// The region used when neither the URL nor `AWS_REGION` / `AWS_DEFAULT_REGION` names
/// one (DynamoDB Local accepts any).
const DEFAULT_REGION: &str = "us-east-1";

/// What a `dynamodb://` URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DynamoTarget {
    /// The endpoint (`http://host:port`, or `https://host` for `dynamodb+https://`);
    /// `None` for the region's AWS endpoint (`dynamodb://aws`).
    pub(crate) endpoint: Option<String>,
    pub(crate) region: String,
    /// The outbox's shard count (`?shards=`): without it the table's own is used (and
    /// the library's default given to a table that has none yet).
    pub(crate) shards: Option<u16>,
}

impl DynamoTarget {
    /// Read `dynamodb://HOST[:PORT][?region=R&shards=N]` (plain HTTP, as DynamoDB Local
    /// serves), `dynamodb+https://HOST[...]`, or `dynamodb://aws[?region=R]` for AWS's
    /// own endpoint of the region.
    pub(crate) fn parse(scheme: &str, rest: &str) -> Result<DynamoTarget, Failure> {
        let usage = |why: String| {
            Failure::usage(why).hint(
                "use dynamodb://host:port (DynamoDB Local), dynamodb+https://host, or \
                 dynamodb://aws?region=eu-west-1 (add &shards=N only to refuse a table of \
                 fewer shards)",
            )
        };
        let rest = rest
            .strip_prefix("//")
            .ok_or_else(|| usage(format!("`{scheme}:{rest}` has no host")))?;
        let (host, query) = rest.split_once('?').unwrap_or((rest, ""));
        let host = host.trim_end_matches('/');
        let mut region = std::env::var("AWS_REGION")
            .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|_| DEFAULT_REGION.to_owned());
        let mut shards = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("region", r)) if !r.is_empty() => region = r.to_owned(),
                Some(("shards", n)) => {
                    shards = n
                        .parse()
                        .map(Some)
                        .ok()
                        .filter(|n| {
                            n.is_some_and(|n| (1..=outbox_dynamodb::MAX_SHARDS).contains(&n))
                        })
                        .ok_or_else(|| {
                            usage(format!(
                                "shards={n} is not a shard count (1 to {})",
                                outbox_dynamodb::MAX_SHARDS
                            ))
                        })?;
                }
                _ => return Err(usage(format!("unknown DynamoDB URL parameter `{pair}`"))),
            }
        }
        if host.is_empty() {
            return Err(usage(format!("`{scheme}://` names no host")));
        }
        let endpoint = match (scheme, host) {
            ("dynamodb", "aws") => None,
            ("dynamodb", _) => Some(format!("http://{host}")),
            _ => Some(format!("https://{host}")),
        };
        Ok(DynamoTarget {
            endpoint,
            region,
            shards,
        })
    }
}

/// A client for `target`, with the credentials of `AWS_ACCESS_KEY_ID` /
/// `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) when set, and the placeholder
/// key `outbox` otherwise (AWS then refuses with a clear error). DynamoDB Local keeps
/// a database per access key and region unless started with `-sharedDb`: pass the key
/// the service uses.
/// Each request gives up after `timeout`.
pub(crate) fn client(target: &DynamoTarget, timeout: Duration) -> Client {
    let credentials = match (
        std::env::var("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Ok(key), Ok(secret)) => Credentials::new(
            key,
            secret,
            std::env::var("AWS_SESSION_TOKEN").ok(),
            None,
            "environment",
        ),
        _ => Credentials::new("outbox", "outbox", None, None, "placeholder"),
    };
    let mut config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(target.region.clone()))
        .credentials_provider(credentials)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(timeout)
                .operation_timeout(timeout)
                .build(),
        );
    if let Some(endpoint) = &target.endpoint {
        config = config.endpoint_url(endpoint);
    }
    Client::from_conf(config.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<DynamoTarget, Failure> {
        let (scheme, rest) = url.split_once(':').unwrap();
        DynamoTarget::parse(scheme, rest)
    }

    #[test]
    fn local_https_and_aws_endpoints() {
        let local = parse("dynamodb://127.0.0.1:8000?region=eu-west-1&shards=4").unwrap();
        assert_eq!(local.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(local.region, "eu-west-1");
        assert_eq!(local.shards, Some(4));
        let tls = parse("dynamodb+https://dynamo.example.com/").unwrap();
        assert_eq!(tls.endpoint.as_deref(), Some("https://dynamo.example.com"));
        assert_eq!(tls.shards, None);
        let aws = parse("dynamodb://aws?region=ap-south-1").unwrap();
        assert_eq!(aws.endpoint, None);
        assert_eq!(aws.region, "ap-south-1");
    }

    #[test]
    fn bad_urls_are_usage_errors() {
        for url in [
            "dynamodb:127.0.0.1",
            "dynamodb://",
            "dynamodb://h?shards=0",
            "dynamodb://h?shards=300",
            "dynamodb://h?shards=x",
            "dynamodb://h?colour=blue",
        ] {
            let failure = parse(url).unwrap_err();
            assert_eq!(failure.exit, crate::fail::Exit::Usage, "{url}");
        }
    }
}
