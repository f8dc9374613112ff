//! What tools need of a backend's storage: [`Schema`].

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;

/// A backend's storage (a table, or a DynamoDB table) as tools see it: its name, what
/// [`install`](Self::install) creates, the layout version it records, and the install
/// itself.
///
/// Every outbox and dedup store of the workspace's backends implements it, so a tool
/// such as the `outbox` CLI holds any of them as `Box<dyn Schema>` instead of
/// dispatching by hand, and a new backend is usable from tools once it implements it.
#[async_trait]
pub trait Schema: Send + Sync + fmt::Debug {
    /// The storage's name as the backend prints it: a schema-qualified table
    /// (`"outbox"."outbox_messages"`, `[dbo].[outbox_messages]`), a table of an SQLite
    /// file, a DynamoDB table.
    fn name(&self) -> String;

    /// What [`install`](Self::install) creates, as text an operator can review (and,
    /// for SQL engines, run by hand): SQL, or for DynamoDB a description of the table.
    fn ddl(&self) -> String;

    /// The storage layout version [`install`](Self::install) records and checks; an
    /// install over storage of another version fails with
    /// [`ErrorKind::Schema`](crate::ErrorKind::Schema).
    fn layout_version(&self) -> u32;

    /// Create what is missing and check what exists; safe to run again and from several
    /// processes at once.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](crate::ErrorKind::Schema) when the storage exists with
    /// another layout; the backend's errors otherwise.
    async fn install(&self) -> Result<()>;
}
