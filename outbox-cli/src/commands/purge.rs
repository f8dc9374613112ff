//! `outbox purge --older-than DURATION [--dry-run]`.

use serde::Serialize;

use super::Place;
use crate::cli::PurgeArgs;
use crate::fail::Failure;
use crate::output::{human, plural, Term};

/// What a purge did or would do, as JSON.
#[derive(Debug, Serialize)]
struct PurgeJson {
    dry_run: bool,
    older_than_secs: u64,
    /// Deleted (or, in a dry run, that would be).
    purged: u64,
    /// Statements run (0 in a dry run).
    batches: u64,
}

pub(super) async fn run(place: &Place, args: &PurgeArgs, term: &Term) -> Result<(), Failure> {
    let admin = place.outbox.admin();
    let age = human(args.older_than);
    let messages = |n| plural(n, "dispatched message", "dispatched messages");
    if args.dry_run {
        let n = admin
            .count_dispatched(args.older_than)
            .await
            .map_err(|e| place.failed("counting dispatched messages", &e))?;
        if term.json() {
            term.json_out(&PurgeJson {
                dry_run: true,
                older_than_secs: args.older_than.as_secs(),
                purged: n,
                batches: 0,
            });
        } else {
            term.out(&format!(
                "dry run: would purge {} completed more than {age} ago from {}; nothing was deleted",
                messages(n),
                place.description
            ));
        }
        return Ok(());
    }
    let (purged, batches) = super::in_batches(
        term,
        args.batch,
        || admin.purge_dispatched(args.older_than, args.batch),
        |e| place.failed("purging dispatched messages", e),
    )
    .await?;
    if term.json() {
        term.json_out(&PurgeJson {
            dry_run: false,
            older_than_secs: args.older_than.as_secs(),
            purged,
            batches,
        });
    } else {
        term.out(&format!(
            "purged {} completed more than {age} ago from {}",
            messages(purged),
            place.description
        ));
    }
    Ok(())
}
