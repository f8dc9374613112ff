//! `outbox dedup purge --older-than DURATION`.

use serde::Serialize;

use crate::backend::Db;
use crate::cli::DedupPurgeArgs;
use crate::fail::Failure;
use crate::output::{human, plural, Term};

/// What a dedup purge did, as JSON.
#[derive(Debug, Serialize)]
struct DedupPurgeJson {
    table: String,
    older_than_secs: u64,
    purged: u64,
    batches: u64,
}

pub(super) async fn purge(db: &Db, args: &DedupPurgeArgs, term: &Term) -> Result<(), Failure> {
    let inbox = db.inbox(Some(args.older_than))?;
    let place = format!("{} at {}", inbox.schema().name(), db.url());
    let (purged, batches) = super::in_batches(
        term,
        args.batch,
        || inbox.store().purge_expired(args.batch),
        |e| {
            let f = Failure::from_library("purging dedup records", &place, e);
            if e.kind() == outbox_core::ErrorKind::Schema {
                f.hint("is the inbox installed there? Check --url, --schema and --inbox-table; `outbox schema install --inbox` creates it")
            } else {
                f
            }
        },
    )
    .await?;
    if term.json() {
        term.json_out(&DedupPurgeJson {
            table: inbox.schema().name(),
            older_than_secs: args.older_than.as_secs(),
            purged,
            batches,
        });
    } else {
        term.out(&format!(
            "purged {} older than {} from {place}",
            plural(purged, "dedup record", "dedup records"),
            human(args.older_than)
        ));
    }
    Ok(())
}
