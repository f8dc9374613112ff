//! The macros that turn the suites into tests (each `#[macro_export]`ed, so they are
//! reached at the crate root), how they group cases by capability, and
//! [`service_test!`](crate::service_test) for a crate's own server-gated tests.

mod backend;
mod conformance;
mod dedup;
pub(crate) mod groups;
mod plan;
mod publisher;
mod service_test;
