//! What a backend implements to run the suites: one harness trait per suite, the
//! [`Fixture`] an outbox case works on, and [`Declared`](crate::Declared), the wrapper
//! through which the suite macros hand a backend's `lacks(...)` list to the cases.

pub(crate) mod consumer;
pub(crate) mod declared;
pub(crate) mod dedup;
mod outbox;
pub(crate) mod plan;
pub(crate) mod publisher;

pub use outbox::{Features, Fixture, Harness, RowLock};
