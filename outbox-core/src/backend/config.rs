//! [`TableConfig`]: the settings of a store kept in one table (an outbox, an inbox of
//! processed ids, an entity table), written once for every backend.
//!
//! A backend names its own rules with a marker type implementing [`TableRules`]
//! (identifier rules, default names, the validated name type) and exports aliases
//! such as `pub type PgDedupConfig = TableConfig<PgRules, DedupTable>;`. What the
//! table holds ([`OutboxTable`], [`DedupTable`], [`EntityTable`]) decides the
//! settings beside the name.
//!
//! Setters are `with_*` and consume the config; getters are named after the fields.
//! Names are checked by `validate` (the stores' constructors call it) and reach
//! statements only as the backend's validated [`TableRules::Name`].

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::limits::MessageLimits;
use crate::store::{KeyOrder, Retention};

/// A backend's rules for the tables a [`TableConfig`] names. Implemented by a marker
/// type of the backend crate.
pub trait TableRules: 'static {
    /// The validated name statements are rendered from (a quoted `schema.table`, a
    /// quoted table, a DynamoDB table name).
    type Name: fmt::Display;
    /// The default schema; empty on an engine whose tables have no schema.
    const SCHEMA: &'static str = "";
    /// The default table of an outbox.
    const OUTBOX_TABLE: &'static str = "outbox_messages";
    /// The default table of an inbox of processed ids.
    const DEDUP_TABLE: &'static str = "outbox_inbox";
    /// The default table of an entity store.
    const ENTITY_TABLE: &'static str = "outbox_entities";

    /// Validate `schema` (empty where there are none) and `table`. `store` names the
    /// kind of store (`"outbox"`, `"dedup"`, `"entity"`) for messages that say which.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the bad part.
    fn name(store: &str, schema: &str, table: &str) -> Result<Self::Name>;

    /// The backend's own checks of an outbox's message limits, after the common ones
    /// (default: none).
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for limits the table cannot hold.
    fn check_limits(limits: &MessageLimits) -> Result<()> {
        let _ = limits;
        Ok(())
    }
}

/// Rules of an engine whose tables live in a schema: their [`TableConfig`]s have
/// `with_schema`, `schema` and `qualified_name`.
pub trait SchemaRules: TableRules {}

/// Rules of an engine whose tables are named by the table alone, checked as a SQL
/// identifier: their [`TableConfig`]s have `table_name`.
pub trait TableOnlyRules: TableRules {}

/// What a table holds: the settings of a [`TableConfig`] beside its name.
pub trait TableKind: fmt::Debug + Clone + PartialEq + Eq {
    /// The kind of store, for messages (`"outbox"`, `"dedup"`, `"entity"`).
    const STORE: &'static str;
    /// The settings' defaults.
    fn default_settings() -> Self;
    /// The default table under the rules `R`.
    fn default_table<R: TableRules>() -> &'static str;
    /// Check the settings.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the first bad one.
    fn validate<R: TableRules>(&self) -> Result<()>;
}

/// An outbox table: claim order, retention and message limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    ordering: KeyOrder,
    retention: Retention,
    limits: MessageLimits,
}

/// An inbox of processed message ids: how long they are remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupTable {
    retention: Duration,
}

/// The entities of a decoupled consumer: nothing beside the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntityTable;

/// How long an inbox remembers ids by default: seven days.
pub const DEFAULT_DEDUP_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

impl TableKind for OutboxTable {
    const STORE: &'static str = "outbox";
    fn default_settings() -> Self {
        OutboxTable {
            ordering: KeyOrder::default(),
            retention: Retention::default(),
            limits: MessageLimits::default(),
        }
    }
    fn default_table<R: TableRules>() -> &'static str {
        R::OUTBOX_TABLE
    }
    fn validate<R: TableRules>(&self) -> Result<()> {
        if let Retention::Keep { window } = self.retention {
            if window.is_zero() {
                return Err(Error::config("retention window must be above zero"));
            }
        }
        R::check_limits(&self.limits)
    }
}

impl TableKind for DedupTable {
    const STORE: &'static str = "dedup";
    fn default_settings() -> Self {
        DedupTable {
            retention: DEFAULT_DEDUP_RETENTION,
        }
    }
    fn default_table<R: TableRules>() -> &'static str {
        R::DEDUP_TABLE
    }
    fn validate<R: TableRules>(&self) -> Result<()> {
        if self.retention.is_zero() {
            return Err(Error::config("dedup retention must be above zero"));
        }
        Ok(())
    }
}

impl TableKind for EntityTable {
    const STORE: &'static str = "entity";
    fn default_settings() -> Self {
        EntityTable
    }
    fn default_table<R: TableRules>() -> &'static str {
        R::ENTITY_TABLE
    }
    fn validate<R: TableRules>(&self) -> Result<()> {
        Ok(())
    }
}

/// Where a store keeps its table, under a backend's rules `R`, and the settings of its
/// kind `K`. Backends export aliases of it (`PgDedupConfig`, `SqliteOutboxConfig`, ...).
pub struct TableConfig<R, K> {
    schema: String,
    table: String,
    settings: K,
    rules: PhantomData<fn() -> R>,
}

impl<R, K: fmt::Debug> fmt::Debug for TableConfig<R, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableConfig")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<R, K: Clone> Clone for TableConfig<R, K> {
    fn clone(&self) -> Self {
        TableConfig {
            schema: self.schema.clone(),
            table: self.table.clone(),
            settings: self.settings.clone(),
            rules: PhantomData,
        }
    }
}

impl<R, K: PartialEq> PartialEq for TableConfig<R, K> {
    fn eq(&self, other: &Self) -> bool {
        (&self.schema, &self.table, &self.settings)
            == (&other.schema, &other.table, &other.settings)
    }
}

impl<R, K: Eq> Eq for TableConfig<R, K> {}

impl<R: TableRules, K: TableKind> Default for TableConfig<R, K> {
    /// The backend's default schema and table for the kind, and the kind's defaults.
    fn default() -> Self {
        TableConfig {
            schema: R::SCHEMA.to_owned(),
            table: K::default_table::<R>().to_owned(),
            settings: K::default_settings(),
            rules: PhantomData,
        }
    }
}

impl<R: TableRules, K: TableKind> TableConfig<R, K> {
    /// Set the table (default [`TableRules::OUTBOX_TABLE`], [`DEDUP_TABLE`](TableRules::DEDUP_TABLE)
    /// or [`ENTITY_TABLE`](TableRules::ENTITY_TABLE) by kind).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The validated name, as the backend's rules check it.
    fn checked_name(&self) -> Result<R::Name> {
        R::name(K::STORE, &self.schema, &self.table)
    }
    /// The name as statements render it, or the table as configured when it does not
    /// validate: for tools that show which table a store uses.
    pub fn display_name(&self) -> String {
        self.checked_name()
            .map_or_else(|_| self.table.clone(), |name| name.to_string())
    }
    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.checked_name()?;
        self.settings.validate::<R>()
    }
}

impl<R: SchemaRules, K: TableKind> TableConfig<R, K> {
    /// Set the schema (default [`TableRules::SCHEMA`], `outbox`).
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }
    /// The validated `schema.table`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a bad schema or table name.
    pub fn qualified_name(&self) -> Result<R::Name> {
        self.checked_name()
    }
}

impl<R: TableOnlyRules, K: TableKind> TableConfig<R, K> {
    /// The validated table name.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a bad name.
    pub fn table_name(&self) -> Result<R::Name> {
        self.checked_name()
    }
}

impl<R: TableRules> TableConfig<R, OutboxTable> {
    /// Set the claim ordering (default [`KeyOrder::Unordered`]).
    #[must_use]
    pub fn with_ordering(mut self, ordering: KeyOrder) -> Self {
        self.settings.ordering = ordering;
        self
    }
    /// Set what completing does (default [`Retention::Delete`]).
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.settings.retention = retention;
        self
    }
    /// Set the limits every enqueued message, and every claimed row, is checked
    /// against (default [`MessageLimits::default`]; a backend may bound them further,
    /// see its [`TableRules::check_limits`]).
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.settings.limits = limits;
        self
    }
    /// The claim ordering.
    pub fn ordering(&self) -> KeyOrder {
        self.settings.ordering
    }
    /// What completing does.
    pub fn retention(&self) -> Retention {
        self.settings.retention
    }
    /// The message limits.
    pub fn limits(&self) -> &MessageLimits {
        &self.settings.limits
    }
    /// The start of an outbox store's `Debug` output, `store { table, ordering,
    /// retention`, for the backend to add its own fields to and finish with
    /// `finish_non_exhaustive`.
    pub fn debug_store<'a, 'b: 'a>(
        &self,
        f: &'a mut fmt::Formatter<'b>,
        store: &str,
    ) -> fmt::DebugStruct<'a, 'b> {
        let mut out = f.debug_struct(store);
        out.field("table", &self.display_name())
            .field("ordering", &self.ordering())
            .field("retention", &self.retention());
        out
    }
}

impl<R: TableRules> TableConfig<R, DedupTable> {
    /// Set how long processed ids are remembered (default seven days,
    /// [`DEFAULT_DEDUP_RETENTION`]). Make it longer than the longest time a broker may
    /// redeliver a message.
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }
    /// How long processed ids are remembered.
    pub fn retention(&self) -> Duration {
        self.settings.retention
    }
    /// [`retention`](Self::retention) in microseconds, as a store binds it.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when it does not fit in 64 bits.
    pub fn retention_micros(&self) -> Result<i64> {
        i64::try_from(self.settings.retention.as_micros())
            .map_err(|_| Error::config("dedup retention is too long"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[derive(Debug)]
    struct Schemas;
    impl TableRules for Schemas {
        type Name = String;
        const SCHEMA: &'static str = "outbox";
        fn name(store: &str, schema: &str, table: &str) -> Result<String> {
            crate::bounds::validate_identifier("schema", schema, 63)?;
            crate::bounds::validate_identifier(store, table, 63)?;
            Ok(format!("{schema}.{table}"))
        }
        fn check_limits(limits: &MessageLimits) -> Result<()> {
            if limits.max_partition_key_len > 400 {
                return Err(Error::config("key too long"));
            }
            Ok(())
        }
    }
    impl SchemaRules for Schemas {}

    #[derive(Debug)]
    struct Tables;
    impl TableRules for Tables {
        type Name = String;
        const DEDUP_TABLE: &'static str = "outbox_dedup";
        fn name(store: &str, _schema: &str, table: &str) -> Result<String> {
            crate::bounds::validate_identifier(store, table, 63)?;
            Ok(table.to_owned())
        }
    }
    impl TableOnlyRules for Tables {}

    #[test]
    fn defaults_come_from_the_rules_and_the_kind() {
        let outbox = TableConfig::<Schemas, OutboxTable>::default();
        outbox.validate().unwrap();
        assert_eq!(outbox.qualified_name().unwrap(), "outbox.outbox_messages");
        assert_eq!(outbox.ordering(), KeyOrder::Unordered);
        assert_eq!(outbox.retention(), Retention::Delete);
        let dedup = TableConfig::<Tables, DedupTable>::default();
        assert_eq!(dedup.table_name().unwrap(), "outbox_dedup");
        assert_eq!(dedup.retention(), DEFAULT_DEDUP_RETENTION);
        let entity = TableConfig::<Schemas, EntityTable>::default().with_schema("s");
        assert_eq!(entity.display_name(), "s.outbox_entities");
        assert_eq!(entity.clone(), entity);
        assert!(format!("{entity:?}").contains("outbox_entities"));
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let wide = MessageLimits {
            max_partition_key_len: 401,
            ..MessageLimits::default()
        };
        let errors = [
            TableConfig::<Schemas, OutboxTable>::default()
                .with_schema("Bad")
                .validate(),
            TableConfig::<Schemas, OutboxTable>::default()
                .with_retention(Retention::Keep {
                    window: Duration::ZERO,
                })
                .validate(),
            TableConfig::<Schemas, OutboxTable>::default()
                .with_limits(wide)
                .validate(),
            TableConfig::<Tables, DedupTable>::default()
                .with_retention(Duration::ZERO)
                .validate(),
            TableConfig::<Tables, EntityTable>::default()
                .with_table("a b")
                .validate(),
        ];
        for error in errors {
            assert_eq!(error.unwrap_err().kind(), ErrorKind::Config);
        }
        let bad = TableConfig::<Tables, EntityTable>::default().with_table("A");
        assert_eq!(bad.display_name(), "A", "shown as configured");
    }

    #[test]
    fn settings_are_kept_and_compared() {
        assert_eq!(DEFAULT_DEDUP_RETENTION, Duration::from_secs(604_800));
        let limits = MessageLimits {
            max_partition_key_len: 7,
            ..MessageLimits::default()
        };
        let keep = Retention::Keep {
            window: Duration::from_secs(5),
        };
        let outbox = TableConfig::<Schemas, OutboxTable>::default()
            .with_schema("s2")
            .with_table("t2")
            .with_ordering(KeyOrder::PerKey)
            .with_retention(keep)
            .with_limits(limits.clone());
        assert_eq!((outbox.schema(), outbox.table()), ("s2", "t2"));
        assert_eq!(outbox.ordering(), KeyOrder::PerKey);
        assert_eq!(outbox.retention(), keep);
        assert_eq!(outbox.limits(), &limits);
        assert_eq!(outbox.qualified_name().unwrap(), "s2.t2");
        assert_eq!(outbox, outbox.clone());
        assert_ne!(outbox, TableConfig::default());
        assert_ne!(outbox, outbox.clone().with_table("t3"));
        assert_ne!(outbox, outbox.clone().with_schema("s3"));
        let dedup =
            TableConfig::<Tables, DedupTable>::default().with_retention(Duration::from_secs(9));
        assert_eq!(dedup.retention(), Duration::from_secs(9));
        assert_ne!(dedup, TableConfig::default());
    }
}
