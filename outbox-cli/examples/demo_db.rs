//! Make an SQLite outbox to try the `outbox` command on: pending, in-flight, dead and
//! dispatched messages, written through the library as an application and its relay
//! would.
//!
//! ```sh
//! cargo run -p outbox-cli --example demo_db -- /tmp/demo.db
//! cargo run -p outbox-cli -- --url sqlite:///tmp/demo.db stats
//! ```

use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt, NewMessage,
    OutboxStore, Retention,
};
use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: demo_db PATH (a new SQLite file)")?;
    if std::path::Path::new(&path).exists() {
        return Err(format!("{path} exists; give a new path").into());
    }
    let pool = outbox_sqlite::open(&path).await?;
    let config = SqliteOutboxConfig::default().with_retention(Retention::Keep {
        window: Duration::from_secs(7 * 86_400),
    });
    let outbox = SqliteOutbox::new(pool.clone(), config)?;
    outbox.install().await?;

    let message = |destination: &str, payload: &str| {
        NewMessage::builder(destination)
            .content_type("application/json")
            .header("trace-id", "4bf92f3577b34da6")
            .payload(payload.as_bytes().to_vec())
            .build()
    };
    let mut batch = Vec::new();
    for n in 1..=9 {
        batch.push(if n % 3 == 0 {
            message("payments.captured", &format!(r#"{{"payment":{n}}}"#))?
        } else {
            message("orders.created", &format!(r#"{{"order":{n}}}"#))?
        });
    }
    let mut tx = pool.begin().await?;
    outbox.enqueue(&mut tx, &batch).await?;
    tx.commit().await?;

    // A relay's claims: three delivered, three dead, one left in flight.
    let claimed = outbox
        .claim(ClaimRequest::new(7, Duration::from_secs(300))?)
        .await?;
    let (delivered, rest) = claimed.split_at(3);
    for c in delivered {
        outbox.complete_one(&c.lease).await?;
    }
    let (dead, in_flight) = rest.split_at(3);
    for c in dead {
        let reason = if c.message.destination == "payments.captured" {
            "publish timed out after 30s"
        } else {
            "broker rejected: schema validation failed at $.order"
        };
        let failure = Failure::new(c.lease, reason, Disposition::DeadLetter);
        outbox.fail_one(failure).await?;
    }
    println!(
        "{path}: 3 dispatched, 3 dead, {} in flight, 2 pending",
        in_flight.len()
    );
    Ok(())
}
