//! The in-memory reference implementations: every store contract and a broker as
//! running code, what the suites are proven against first, and the harnesses that run
//! the suites over them. Handy for unit-testing services too.

pub(crate) mod broker;
pub(crate) mod dedup;
pub(crate) mod entity;
pub(crate) mod harness;
pub(crate) mod store;
