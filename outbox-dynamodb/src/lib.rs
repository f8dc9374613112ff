//! # outbox-dynamodb
//!
//! DynamoDB backend for the transactional outbox and a strongly consistent dedup store
//! (aws-sdk-dynamodb, conditional writes, `TransactWriteItems`).
//!
//! **Not implemented yet.** This crate reserves the name and place in the workspace;
//! its own issue fills it. It exports nothing.
