//! # outbox-sqlserver
//!
//! SQL Server backend for the transactional outbox (tiberius + bb8, claims with
//! `WITH (UPDLOCK, READPAST, ROWLOCK)`, `sp_getapplock` locks).
//!
//! **Not implemented yet.** This crate reserves the name and place in the workspace;
//! its own issue fills it. It exports nothing.
