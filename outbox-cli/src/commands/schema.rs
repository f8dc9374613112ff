//! `outbox schema print | install [--inbox]`.

use serde::Serialize;

use crate::backend::Db;
use crate::cli::SchemaArgs;
use crate::fail::Failure;
use crate::output::Term;

/// The DDL as JSON.
#[derive(Debug, Serialize)]
struct DdlJson {
    table: String,
    ddl: String,
}

/// What `install` did, as JSON.
#[derive(Debug, Serialize)]
struct InstallJson {
    table: String,
    installed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    layout_version: Option<u32>,
}

pub(super) fn print(db: &Db, args: &SchemaArgs, term: &Term) -> Result<(), Failure> {
    let (table, ddl) = if args.inbox {
        let inbox = db.inbox(None)?;
        (inbox.schema().name(), inbox.schema().ddl())
    } else {
        let outbox = db.outbox()?;
        (outbox.schema().name(), outbox.schema().ddl())
    };
    if term.json() {
        term.json_out(&DdlJson { table, ddl });
    } else {
        term.out(ddl.trim_end());
    }
    Ok(())
}

pub(super) async fn install(db: &Db, args: &SchemaArgs, term: &Term) -> Result<(), Failure> {
    let (table, result, version) = if args.inbox {
        let inbox = db.inbox(None)?;
        let schema = inbox.schema();
        (schema.name(), schema.install().await, None)
    } else {
        let outbox = db.outbox()?;
        let schema = outbox.schema();
        let version = schema.layout_version();
        (schema.name(), schema.install().await, Some(version))
    };
    let place = format!("{table} at {}", db.url());
    result.map_err(|e| {
        let failure = Failure::from_library("installing", &place, &e);
        if e.kind() == outbox_core::ErrorKind::Schema {
            // Here a schema error is a table of another layout, not a missing one.
            failure.hint("the table exists with another layout; migrate it with your migration tool (see `outbox schema print`), or pick another --table")
        } else {
            failure
        }
    })?;
    if term.json() {
        term.json_out(&InstallJson {
            table,
            installed: true,
            layout_version: version,
        });
    } else {
        let version = version.map_or_else(String::new, |v| format!(" (layout version {v})"));
        term.out(&format!(
            "installed {place}{version}; already there is fine too"
        ));
    }
    Ok(())
}
