//! The idempotent, versioned installer of the tables in `schema.rs`.
//!
//! # Protocol
//!
//! 1. On a dedicated connection, `SET XACT_ABORT ON; SET LOCK_TIMEOUT 5000; BEGIN
//!    TRANSACTION` (any error aborts the whole install; no lock is waited on for more
//!    than five seconds).
//! 2. Take the per-schema install lock (`sp_getapplock`, transaction-owned, waiting up
//!    to a minute), so concurrent installs run one after another.
//! 3. Create the schema and the version table `[<schema>].[outbox_schema_versions]` if
//!    missing, and read the table's recorded layout version.
//! 4. - Not recorded: create the table's objects, record its layout version.
//!    - Recorded at the crate's version: nothing to create.
//!    - Recorded at another version: [`ErrorKind::Schema`], nothing changed. An outbox
//!      table at layout 1 is refused with the way to upgrade it.
//! 5. Commit.
//! 6. Outside the transaction, with `XACT_ABORT OFF` and the same lock time-out, apply
//!    the settings that are not set yet (`OPTIMIZE_FOR_SEQUENTIAL_KEY` on a server that
//!    has it, a table created from an older DDL text). They are `ALTER INDEX`es, which
//!    need a schema-modification lock: on a live table that lock queues behind every
//!    open transaction touching it, and every new enqueue queues behind the request.
//!    So a setting refused within the lock time-out (or for want of permission) is
//!    logged as not applied, and the install succeeds; the next install tries again.
//! 7. Read the table's `LOCK_ESCALATION` back ([`lock_escalation`]), for the caller
//!    to size its statements by.

use outbox_core::{Error, ErrorKind, Result};

use crate::error::from_tiberius;
use crate::exec::{query_all_rows, query_rows, row_i32, row_str};
use crate::ident::QualifiedName;
use crate::schema::{prelude, Layout, SCHEMA_VERSION, SET_OPTIONS, VERSION_TABLE};
use crate::session::{rollback_quietly, MssqlClient, COMMIT};
use crate::sql::{Binder, Param, Stmt};

/// Begins the installer's transaction: any error aborts it whole; a lock is waited on
/// for at most five seconds (the install lock itself, a minute).
pub(crate) const INSTALL_BEGIN: &str =
    "SET XACT_ABORT ON; SET LOCK_TIMEOUT 5000; BEGIN TRANSACTION;";

/// Ends the transaction's `XACT_ABORT` before the settings: a refused `ALTER` must not
/// end the session's batch.
pub(crate) const SETTINGS_BEGIN: &str = "SET XACT_ABORT OFF; SET LOCK_TIMEOUT 5000; ";

/// The table's `LOCK_ESCALATION` setting (`TABLE`, `AUTO` or `DISABLE`).
pub(crate) fn lock_escalation(name: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let table = b.bind(Param::Text(Some(name.to_string())));
    b.finish(format!(
        "SELECT lock_escalation_desc AS escalation FROM sys.tables \
         WHERE object_id = OBJECT_ID({table});"
    ))
}

/// What an install found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Installed {
    /// The table's `LOCK_ESCALATION` (`DISABLE` as created).
    pub(crate) lock_escalation: Option<String>,
    /// Whether every setting was applied (false: one was refused, and logged).
    pub(crate) settings_applied: bool,
}

/// Take the per-schema install lock for the current transaction, waiting up to a
/// minute.
pub(crate) fn install_lock(name: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let resource = b.bind(Param::Text(Some(format!(
        "outbox-sqlserver:install:{}",
        name.schema()
    ))));
    b.finish(format!(
        "EXEC sp_getapplock @Resource = {resource}, @LockMode = 'Exclusive', \
         @LockOwner = 'Transaction', @LockTimeout = 60000; \
         SELECT APPLOCK_MODE('public', {resource}, 'Transaction') AS mode;"
    ))
}

/// The recorded layout version of `name`, if any.
pub(crate) fn installed_version(name: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let table = b.bind(Param::Text(Some(name.table().to_owned())));
    b.finish(format!(
        "SELECT version FROM {versions} WHERE table_name = {table};",
        versions = name.sibling(VERSION_TABLE),
    ))
}

/// Record `name` at layout `version`.
pub(crate) fn record_version(name: &QualifiedName, version: i32) -> Stmt {
    let mut b = Binder::default();
    let table = b.bind(Param::Text(Some(name.table().to_owned())));
    let version = b.bind(Param::I32(version));
    b.finish(format!(
        "INSERT INTO {versions} (table_name, version) VALUES ({table}, {version});",
        versions = name.sibling(VERSION_TABLE),
    ))
}

/// Why a table recorded at `installed` is refused by a crate expecting `expected`.
pub(crate) fn version_mismatch(name: &QualifiedName, installed: i32, expected: u32) -> Error {
    let upgrade = if installed == 1 && expected == SCHEMA_VERSION {
        " (layout 2 re-creates the outbox's due and dead-letter indexes with included \
         columns: run the statements under \"Upgrading from layout 1\" in the \
         outbox-sqlserver README, then install again)"
    } else {
        ""
    };
    Error::new(
        ErrorKind::Schema,
        format!(
            "table {name} is at layout version {installed}, this crate expects \
             {expected}{upgrade}"
        ),
    )
}

/// Install `layout` as `name` (see the module's protocol): one transaction on `client`
/// (a dedicated connection; on an error it is rolled back before the error returns).
///
/// # Errors
/// [`ErrorKind::Schema`] when the table was installed at another layout version, or
/// the install lock could not be had within a minute; mapped driver errors otherwise.
pub(crate) async fn install(
    client: &mut MssqlClient,
    name: &QualifiedName,
    layout: &Layout,
) -> Result<Installed> {
    let result = install_in_transaction(client, name, layout).await;
    if result.is_err() {
        rollback_quietly(client).await;
    }
    result?;
    let settings_applied = layout.settings.is_empty()
        || match batch(
            client,
            format!("{SETTINGS_BEGIN}{SET_OPTIONS}{}", layout.settings),
        )
        .await
        {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(
                    table = %name,
                    error = %err.report(),
                    "a table setting was not applied (a lock not granted within 5 s, or a \
                     permission missing); the next install tries again"
                );
                false
            }
        };
    let rows = query_rows(client, lock_escalation(name))
        .await
        .map_err(|e| from_tiberius("schema install", e))?;
    let lock_escalation = rows
        .first()
        .map(|row| row_str(row, "escalation"))
        .transpose()?;
    Ok(Installed {
        lock_escalation,
        settings_applied,
    })
}

/// Run `sql` as a plain batch, reading every result.
async fn batch(client: &mut MssqlClient, sql: String) -> Result<()> {
    let err = |e| from_tiberius("schema install", e);
    client
        .simple_query(sql)
        .await
        .map_err(err)?
        .into_results()
        .await
        .map_err(err)?;
    Ok(())
}

async fn install_in_transaction(
    client: &mut MssqlClient,
    name: &QualifiedName,
    layout: &Layout,
) -> Result<()> {
    let err = |e| from_tiberius("schema install", e);
    // The version column is an `int`.
    let expected = i32::try_from(layout.version).map_err(|_| {
        Error::new(
            ErrorKind::Schema,
            format!(
                "layout version {} does not fit the version column",
                layout.version
            ),
        )
    })?;
    batch(client, INSTALL_BEGIN.to_owned()).await?;
    let locked = query_all_rows(client, install_lock(name))
        .await
        .map_err(err)?;
    let mode = locked.first().map(|row| row_str(row, "mode")).transpose()?;
    if mode.as_deref() != Some("Exclusive") {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "could not take the install lock of schema {} within a minute",
                name.quoted_schema()
            ),
        ));
    }
    batch(client, format!("{SET_OPTIONS}{}", prelude(name))).await?;
    let installed = query_rows(client, installed_version(name))
        .await
        .map_err(err)?;
    match installed
        .first()
        .map(|row| row_i32(row, "version"))
        .transpose()?
    {
        Some(version) if version == expected => {}
        Some(other) => return Err(version_mismatch(name, other, layout.version)),
        None => {
            batch(client, format!("{SET_OPTIONS}{}", layout.objects)).await?;
            query_rows(client, record_version(name, expected))
                .await
                .map_err(err)?;
        }
    }
    batch(client, COMMIT.to_owned()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_wait_for_no_lock_longer_than_five_seconds() {
        // Without it a dedicated connection waits without end (LOCK_TIMEOUT -1): an
        // ALTER queued behind an open enqueue would queue every later enqueue too.
        for begin in [INSTALL_BEGIN, SETTINGS_BEGIN] {
            assert!(begin.contains("SET LOCK_TIMEOUT 5000;"), "{begin}");
        }
        assert!(INSTALL_BEGIN.starts_with("SET XACT_ABORT ON;"));
        assert!(INSTALL_BEGIN.ends_with("BEGIN TRANSACTION;"));
        // The settings run outside the transaction, where a refused ALTER is reported
        // and the batch does not abort the session.
        assert!(SETTINGS_BEGIN.starts_with("SET XACT_ABORT OFF;"));
        assert!(!SETTINGS_BEGIN.contains("TRANSACTION"));
        // LOCK_ESCALATION is applied with the objects (at creation), not as a setting.
        let name = QualifiedName::new("s", "t").unwrap();
        let layout = crate::schema::outbox_layout(&name);
        assert!(layout.objects.contains("LOCK_ESCALATION = DISABLE"));
        assert!(!layout.settings.contains("LOCK_ESCALATION"));
    }

    #[test]
    fn a_layout_1_outbox_is_refused_with_the_way_to_upgrade() {
        let name = QualifiedName::new("s", "t").unwrap();
        let refused = version_mismatch(&name, 1, SCHEMA_VERSION);
        assert_eq!(refused.kind(), ErrorKind::Schema);
        assert!(!refused.is_retryable());
        assert!(
            refused.message().contains("Upgrading from layout 1"),
            "{}",
            refused.message()
        );
        let other = version_mismatch(&name, 7, SCHEMA_VERSION);
        assert!(other
            .message()
            .ends_with("is at layout version 7, this crate expects 2"));
        assert!(include_str!("../README.md").contains("### Upgrading from layout 1"));
    }
}
