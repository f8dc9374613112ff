//! A publisher that misbehaves on cue, for the fault cases every relay runs:
//! [`FaultyPublisher`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::relay::metrics::{COMMIT_TO_PUBLISH_SECONDS, DISPATCHED, PANICS, RETRIED};
use outbox_core::{Message, PublishOutcome, Publisher, Result};

use crate::{RecordingPublisher, TestRecorder};

/// What a [`FaultyPublisher`] does to one call instead of publishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishFault {
    /// Panic (`"injected publisher panic"`).
    Panic,
    /// Never answer: the relay's publish timeout must end the call.
    Hang,
    /// Answer one `Published` more than the call's messages, publishing nothing: a
    /// relay that trusted the answer would complete messages the broker never saw.
    WrongCount,
}

/// A [`RecordingPublisher`] whose next calls fail as injected ([`inject`](Self::inject)),
/// in order; every other call reaches the recording publisher. A faulty call publishes
/// nothing. Clones share the faults and the list of faults done.
#[derive(Debug, Clone)]
pub struct FaultyPublisher {
    inner: RecordingPublisher,
    queued: Arc<Mutex<VecDeque<PublishFault>>>,
    done: Arc<Mutex<Vec<PublishFault>>>,
}

impl FaultyPublisher {
    /// Wrap `inner`, with no fault queued.
    pub fn new(inner: RecordingPublisher) -> Self {
        FaultyPublisher {
            inner,
            queued: Arc::default(),
            done: Arc::default(),
        }
    }

    /// Make the next `times` calls (after those already queued) fail with `fault`.
    pub fn inject(&self, fault: PublishFault, times: usize) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        queued.extend(std::iter::repeat_n(fault, times));
    }

    /// The faults of the calls made so far, in order.
    pub fn faults_done(&self) -> Vec<PublishFault> {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The recording publisher behind it: what reached the broker.
    pub fn recording(&self) -> &RecordingPublisher {
        &self.inner
    }
}

#[async_trait]
impl Publisher for FaultyPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let fault = self
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        let Some(fault) = fault else {
            return self.inner.publish(batch).await;
        };
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fault);
        match fault {
            PublishFault::Panic => panic!("injected publisher panic"),
            PublishFault::Hang => std::future::pending().await,
            PublishFault::WrongCount => Ok(vec![PublishOutcome::Published; batch.len() + 1]),
        }
    }
}

/// What every relay's publish-fault case checks, through the metrics both relays share
/// (registered with `recorder`, labelled `relay` = `relay`), once `messages` messages
/// were published after the faulty calls: each faulty call published nothing and
/// failed its messages retryably (an attempt each, counted as retried), a panic was
/// counted, the retry published every message once, and only accepted messages were
/// timed.
///
/// # Panics
/// When one of these does not hold.
pub fn assert_recovered_from_faults(
    publisher: &FaultyPublisher,
    recorder: &TestRecorder,
    relay: &str,
    messages: u64,
) {
    let faults = publisher.faults_done();
    assert!(!faults.is_empty(), "no fault was injected into a call");
    let label = format!("relay={relay}");
    let calls = u32::try_from(faults.len()).expect("a test injects few faults");
    let published = publisher.recording().published();
    assert_eq!(
        published.len() as u64,
        messages,
        "the faulty calls published nothing"
    );
    for m in &published {
        assert_eq!(
            m.attempts,
            1 + calls,
            "every faulty call counted as an attempt of {}",
            m.id
        );
    }
    assert_eq!(
        recorder.counter(RETRIED, &label),
        messages * u64::from(calls),
        "retried"
    );
    assert_eq!(recorder.counter(DISPATCHED, &label), messages, "dispatched");
    let panics = faults.iter().filter(|f| **f == PublishFault::Panic).count() as u64;
    assert_eq!(recorder.counter(PANICS, &label), panics, "panics");
    assert_eq!(
        recorder.samples(COMMIT_TO_PUBLISH_SECONDS, &label),
        messages,
        "only accepted messages are timed"
    );
}
