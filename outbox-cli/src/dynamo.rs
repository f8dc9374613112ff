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
    /// Whether the endpoint is plain HTTP (DynamoDB Local, or another emulator), not
    /// AWS.
    fn is_local(&self) -> bool {
        self.endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
    }

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

/// A client for `target`; each request gives up after `timeout`.
///
/// On AWS (`dynamodb://aws`, `dynamodb+https://`), credentials come from the SDK's
/// default chain, as any AWS tool finds them: `AWS_ACCESS_KEY_ID` /
/// `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), the shared config and credentials
/// files (`AWS_PROFILE`), web identity (EKS service accounts), the container's role
/// (ECS) and the instance profile (EC2). On a plain-HTTP endpoint (DynamoDB Local), the
/// environment's keys when set and the placeholder key `outbox` otherwise, without
/// asking the chain (whose instance-metadata probe only adds a delay there): DynamoDB
/// Local keeps a database per access key and region unless started with `-sharedDb`,
/// so pass the key the service uses.
pub(crate) async fn client(target: &DynamoTarget, timeout: Duration) -> Client {
    client_with(
        target,
        timeout,
        aws_config::defaults(BehaviorVersion::latest()),
    )
    .await
}

/// [`client`], with the credential chain of `loader` on AWS (tests give it their own
/// profile files).
async fn client_with(
    target: &DynamoTarget,
    timeout: Duration,
    loader: aws_config::ConfigLoader,
) -> Client {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(timeout)
        .operation_timeout(timeout)
        .build();
    let mut config = match shared_config(target, loader).await {
        Some(shared) => aws_sdk_dynamodb::config::Builder::from(&shared),
        None => aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .credentials_provider(local_credentials()),
    };
    config = config
        .region(Region::new(target.region.clone()))
        .timeout_config(timeouts);
    if let Some(endpoint) = &target.endpoint {
        config = config.endpoint_url(endpoint);
    }
    Client::from_conf(config.build())
}

/// On AWS, what `loader` finds for `target`'s region: the default credential chain
/// and the rest of the shared configuration. `None` for a plain-HTTP endpoint.
async fn shared_config(
    target: &DynamoTarget,
    loader: aws_config::ConfigLoader,
) -> Option<aws_config::SdkConfig> {
    if target.is_local() {
        return None;
    }
    Some(
        loader
            .region(Region::new(target.region.clone()))
            .load()
            .await,
    )
}

/// The environment's keys, or the placeholder key `outbox`.
fn local_credentials() -> Credentials {
    match (
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
    }
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

    /// On AWS the SDK's default chain finds the credentials (here, in a profile file,
    /// unless the environment has keys: the chain asks it first); before, the CLI knew
    /// only the environment's keys and signed with the placeholder otherwise, so it
    /// could not run under an IAM role. DynamoDB Local gets the environment's keys or
    /// the placeholder, never the chain.
    #[tokio::test]
    async fn aws_credentials_come_from_the_default_chain() {
        use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
        use aws_sdk_dynamodb::config::ProvideCredentials;
        let loader = || {
            let files = EnvConfigFiles::builder()
                .with_contents(
                    EnvConfigFileKind::Credentials,
                    "[default]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = s\n",
                )
                .build();
            aws_config::defaults(BehaviorVersion::latest()).profile_files(files)
        };
        let environment = std::env::var("AWS_ACCESS_KEY_ID")
            .ok()
            .filter(|_| std::env::var("AWS_SECRET_ACCESS_KEY").is_ok());
        let expected = environment
            .clone()
            .unwrap_or_else(|| "AKIDPROFILE".to_owned());
        for url in [
            "dynamodb://aws?region=eu-west-1",
            "dynamodb+https://dynamo.example.com",
        ] {
            let target = parse(url).unwrap();
            let shared = shared_config(&target, loader()).await.unwrap();
            assert_eq!(
                shared.region().map(ToString::to_string).as_deref(),
                Some(target.region.as_str())
            );
            let provider = shared.credentials_provider().unwrap();
            let credentials = provider.provide_credentials().await.unwrap();
            assert_eq!(credentials.access_key_id(), expected, "{url}");
        }
        let local = parse("dynamodb://127.0.0.1:8000").unwrap();
        assert!(shared_config(&local, loader()).await.is_none());
        let expected = environment.unwrap_or_else(|| "outbox".to_owned());
        assert_eq!(local_credentials().access_key_id(), expected);
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
