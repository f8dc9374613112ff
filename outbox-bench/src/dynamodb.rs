//! DynamoDB Local for the DynamoDB benches.

use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::Client;

/// A client for the endpoint at `url` (DynamoDB Local), with fixed dummy credentials
/// and region `us-east-1`.
pub fn client(url: &str) -> Client {
    Client::from_conf(
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(url)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("outbox", "outbox", None, None, "bench"))
            .build(),
    )
}

/// A table name of its own for `what`: `obx_<secs>_<random>_<what>`.
pub fn table_name(what: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("obx_{secs}_{}_{what}", &rand[..12])
}
