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
    let place = format!("{} at {}", inbox.name(), db.url());
    let (mut purged, mut batches) = (0u64, 0u64);
    loop {
        let n = inbox
            .store()
            .purge_expired(args.batch)
            .await
            .map_err(|e| {
                let mut f = Failure::from_library("purging dedup records", &place, &e);
                if purged > 0 {
                    f.message.push_str(&format!(" ({purged} deleted before that)"));
                }
                if e.kind() == outbox_core::ErrorKind::Schema {
                    f = f.hint("is the inbox installed there? Check --url, --schema and --inbox-table; `outbox schema install --inbox` creates it");
                }
                f
            })?;
        batches += 1;
        purged += n;
        if n == args.batch as u64 {
            // Another batch follows: say how far it got.
            term.note(&format!(
                "purged {purged} so far ({})",
                plural(batches, "batch", "batches")
            ));
        }
        if n < args.batch as u64 {
            break;
        }
    }
    if term.json() {
        term.json_out(&DedupPurgeJson {
            table: inbox.name(),
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
