//! The publisher conformance suite against standard queues of the SQS endpoint named by
//! `OUTBOX_SQS_URL` (moto, started by `scripts/services.sh`; skipped with a visible
//! line when it is unset).
//!
//! Standard queues keep no dedup window (SQS deduplicates only on FIFO queues), so
//! that case is declared lacking; consumers deduplicate on `outbox-message-id`.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-sqs --test conformance`

mod common;

use common::SqsHarness;

async fn harness() -> Option<SqsHarness> {
    let url = common::url("outbox-sqs publisher conformance (standard queues)")?;
    Some(SqsHarness { url, fifo: false })
}

outbox_testkit::publisher_suite!(harness; lacks(dedup_window));
