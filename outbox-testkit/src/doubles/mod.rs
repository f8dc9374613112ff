//! Test doubles: publishers that record, fail, slow down or reject, and a `metrics`
//! recorder that keeps what was recorded.

pub(crate) mod publishers;
pub(crate) mod recorder;
