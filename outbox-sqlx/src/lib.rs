#![doc = include_str!("../README.md")]

mod admin;
mod entity;
mod error;
mod inbox;

pub use admin::{
    change_dead, count_dead, count_dispatched, purge_dispatched, AdminEngine, AdminStatements,
    Query, SqlxAdmin,
};
pub use entity::{
    load_entity, persist_entity, EntityEngine, EntityStatements, JsonColumn, SqlxEntities,
};
pub use error::{from_sqlx, ErrorCodes};
pub use inbox::{
    contains, process, purge_expired, record, record_in, InboxEngine, InboxStatements, SqlxInbox,
};

/// What the expansions of [`sqlx_dedup_store!`], [`sqlx_outbox_admin!`] and
/// [`sqlx_entity_store!`] name, reachable from the backend crate.
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    pub use futures::future::BoxFuture;
}
