//! testkit (in progress)
pub mod env;
pub mod harness;
pub use env::{integration_required, service_url};
pub use harness::{Features, Fixture, FixtureOptions, Harness, RowLock};
