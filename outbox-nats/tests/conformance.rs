//! The publisher conformance suite against the live NATS JetStream named by
//! `OUTBOX_NATS_URL` (skipped with a visible line when it is unset).
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-nats --test conformance`

mod common;

use common::NatsHarness;

async fn harness() -> Option<NatsHarness> {
    let url = common::url("outbox-nats publisher conformance")?;
    Some(NatsHarness { url })
}

outbox_testkit::publisher_suite!(harness);
