//! The publisher conformance suite against FIFO queues of the SQS endpoint named by
//! `OUTBOX_SQS_URL` (moto, started by `scripts/services.sh`; skipped with a visible
//! line when it is unset). Every case runs: the message id is the
//! `MessageDeduplicationId`, so repeats within five minutes are dropped.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-sqs --test conformance_fifo`

mod common;

use common::SqsHarness;

async fn harness() -> Option<SqsHarness> {
    let url = common::url("outbox-sqs publisher conformance (FIFO queues)")?;
    Some(SqsHarness { url, fifo: true })
}

outbox_testkit::publisher_suite!(harness);
