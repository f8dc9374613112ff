//! Test plumbing: gating on services, isolating fixtures, waiting with deadlines, free
//! ports, CPU time for benches, and a private DynamoDB Local.

pub mod cpu;
pub mod dynamodb_local;
pub mod env;
pub mod isolation;
pub(crate) mod ports;
pub mod wait;
