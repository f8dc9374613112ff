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

/// Implement [`Schema`] for a store whose inherent `ddl()` and `install()` are the
/// schema's, given how to name it and its layout version. For backend authors; the SQL
/// backends use it.
///
/// ```
/// use outbox_core::schema::Schema;
///
/// #[derive(Debug)]
/// struct MyOutbox;
///
/// impl MyOutbox {
///     fn ddl(&self) -> String {
///         "CREATE TABLE IF NOT EXISTS my_outbox (...)".to_owned()
///     }
///
///     async fn install(&self) -> outbox_core::Result<()> {
///         Ok(())
///     }
/// }
///
/// outbox_core::backend::schema_from_inherent!(MyOutbox, name = |_s| "my_outbox".to_owned(), version = 3);
///
/// let tool: Box<dyn Schema> = Box::new(MyOutbox);
/// assert_eq!((tool.name(), tool.layout_version()), ("my_outbox".to_owned(), 3));
/// assert!(tool.ddl().starts_with("CREATE TABLE"));
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! schema_from_inherent {
    ($store:ty, name = |$s:ident| $name:expr, version = $version:expr) => {
        #[$crate::schema::__async_trait]
        impl $crate::schema::Schema for $store {
            fn name(&self) -> String {
                let $s = self;
                $name
            }

            fn ddl(&self) -> String {
                <$store>::ddl(self)
            }

            fn layout_version(&self) -> u32 {
                $version
            }

            async fn install(&self) -> $crate::Result<()> {
                <$store>::install(self).await
            }
        }
    };
}

#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;
