//! PostgreSQL test support that needs no database driver, for any PostgreSQL backend
//! (on sqlx, tokio-postgres or another driver): a private cluster with settings of its
//! own ([`cluster`]), and the engine text every PostgreSQL backend's tests send with
//! their own driver: reading `EXPLAIN` output for the plan suite ([`plans`]), loading
//! history without statistics ([`history`]), finding and ending the session that holds
//! an advisory lock ([`locks`]), and dropping stale test schemas ([`schemas`]).

pub mod cluster;
pub mod history;
pub mod locks;
pub mod plans;
pub mod schemas;
