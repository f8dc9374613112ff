//! What the lock suite cannot see of [`DynamoDistributedLock`]: fencing tokens,
//! renewals and lost leases (the suite runs from `tests/conformance.rs`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use outbox_core::lock::LockGuard as _;
use outbox_core::{ErrorKind, LockName, Result};
use outbox_dynamodb::{DynamoDistributedLock, DynamoLockConfig, DynamoLockGuard};
use outbox_testkit::wait_until;

use crate::common;

fn handle(url: &str, config: &DynamoLockConfig) -> Result<DynamoDistributedLock> {
    DynamoDistributedLock::new(common::client_for(url), config.clone())
}

async fn installed(config: DynamoLockConfig) -> Option<(String, Client, DynamoLockConfig)> {
    let url = common::url("outbox-dynamodb lock conformance")?;
    let admin = common::client("outbox-dynamodb lock conformance").await?;
    let config = config.with_table(common::table_name("locks"));
    handle(&url, &config)
        .expect("valid lock config")
        .install()
        .await
        .expect("install the lock table");
    Some((url, admin, config))
}

fn name(label: &str) -> LockName {
    LockName::new(format!("{label} {}", uuid::Uuid::new_v4().simple())).unwrap()
}

async fn take(lock: &DynamoDistributedLock, name: &LockName) -> DynamoLockGuard {
    lock.acquire(name)
        .await
        .expect("acquire")
        .expect("the lock is free")
}

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// The lease of the renewal test: renewals must hold the lock past it.
const RENEWED_LEASE: Duration = Duration::from_secs(1);

/// A lock config with this lease, renewed this often.
fn renewing_every(lease: Duration, every: Duration) -> DynamoLockConfig {
    DynamoLockConfig::default()
        .with_lease(lease)
        .with_renew_every(every)
}

dynamo_test! {
    async fn fencing_tokens_grow_with_every_acquisition(
        (url, admin, config) = installed(DynamoLockConfig::default())
    ) {
        let (ours, theirs) = (
            handle(&url, &config).unwrap(),
            handle(&url, &config).unwrap(),
        );
        let name = name("fencing");
        let first = take(&ours, &name).await;
        let one = first.fencing_token();
        Box::new(first).unlock().await.unwrap();
        let second = take(&theirs, &name).await;
        let two = second.fencing_token();
        assert!(two > one, "token {two} after unlock is not above {one}");
        // A lapsed lease taken over also gets a larger token, and the old holder's unlock
        // is refused with a conflict instead of releasing the new holder.
        common::lapse_lock(&admin, config.table(), &name).await.unwrap();
        let third = take(&ours, &name).await;
        assert!(third.fencing_token() > two);
        let err = Box::new(second).unlock().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{}", err.report());
        assert!(theirs.acquire(&name).await.unwrap().is_none());
        Box::new(third).unlock().await.unwrap();
    }

    async fn renewals_hold_the_lock_past_its_first_lease(
        (url, _admin, config) = installed(renewing_every(RENEWED_LEASE, Duration::from_millis(200)))
    ) {
        let lease = RENEWED_LEASE;
        let (ours, theirs) = (
            handle(&url, &config).unwrap(),
            handle(&url, &config).unwrap(),
        );
        let name = name("renewed");
        let guard = take(&ours, &name).await;
        // Wait (on the clock, with a deadline) until the first lease would have lapsed
        // twice over; only renewals keep the lock held.
        let past = now() + lease * 2;
        wait_until("two lease periods to pass", || async move { now() > past }).await;
        assert!(!guard.is_lost(), "a renewed guard reports itself lost");
        assert!(
            theirs.acquire(&name).await.unwrap().is_none(),
            "the lock was granted while its holder kept renewing"
        );
        Box::new(guard).unlock().await.unwrap();
        let next = take(&theirs, &name).await;
        Box::new(next).unlock().await.unwrap();
    }

    async fn a_lapsed_lease_is_reported_lost_and_never_revived(
        (url, admin, config) = installed(renewing_every(Duration::from_secs(1), Duration::from_millis(100)))
    ) {
        let ours = handle(&url, &config).unwrap();
        let name = name("lapsed");
        let guard = Arc::new(take(&ours, &name).await);
        common::lapse_lock(&admin, config.table(), &name).await.unwrap();
        let watched = guard.clone();
        wait_until("the guard to notice its lease lapsed", || {
            let g = watched.clone();
            async move { g.is_lost() }
        })
        .await;
        // Its renewals stopped without reviving the lease: anyone may take it.
        let theirs = handle(&url, &config).unwrap();
        let next = take(&theirs, &name).await;
        assert!(next.fencing_token() > guard.fencing_token());
        Box::new(next).unlock().await.unwrap();
    }
}

/// Bad settings fail before any request. (The Global Table refusal is unit-tested in
/// schema.rs on a described table: DynamoDB Local cannot create replicas.)
#[tokio::test]
async fn bad_settings_are_config_errors() {
    let err = DynamoDistributedLock::new(
        common::client_for("http://127.0.0.1:1"),
        DynamoLockConfig::default().with_lease(Duration::from_millis(10)),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}
