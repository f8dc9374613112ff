//! The verbs. Each runs on the library's public API and prints through [`Term`].

mod dead;
mod dedup;
mod purge;
mod schema;
mod stats;

use crate::backend::{Db, Outbox, Reach};
use crate::cli::{Cli, Command, DeadCommand, DedupCommand, SchemaCommand};
use crate::fail::Failure;
use crate::output::Term;
use crate::target::Target;

/// Run the parsed command line.
pub(crate) async fn run(cli: &Cli, term: &Term) -> Result<(), Failure> {
    let Some(url) = cli.global.url.as_deref() else {
        return Err(Failure::usage("no database URL")
            .hint("pass --url postgres://..., sqlite://path.db, sqlserver://... or dynamodb://..., or set OUTBOX_URL"));
    };
    let target = Target::parse(url, term.secrets())?;
    let reach = match &cli.command {
        Command::Schema(SchemaCommand::Print(_)) => Reach::Offline,
        Command::Schema(SchemaCommand::Install(_)) => Reach::Create,
        _ => Reach::Existing,
    };
    let db = Db::open(&cli.global, &target, reach).await?;
    match &cli.command {
        Command::Stats(args) => stats::run(&Place::of(&db)?, args, term).await,
        Command::Dead(dead) => {
            let place = Place::of(&db)?;
            match dead {
                DeadCommand::List(args) => dead::list(&place, args, term).await,
                DeadCommand::Show(args) => dead::show(&place, args, term).await,
                DeadCommand::Requeue(args) => {
                    dead::change(&place, dead::Change::Requeue, args, term).await
                }
                DeadCommand::Discard(args) => {
                    dead::change(&place, dead::Change::Discard, args, term).await
                }
            }
        }
        Command::Purge(args) => purge::run(&Place::of(&db)?, args, term).await,
        Command::Schema(SchemaCommand::Print(args)) => schema::print(&db, args, term),
        Command::Schema(SchemaCommand::Install(args)) => schema::install(&db, args, term).await,
        Command::Dedup(DedupCommand::Purge(args)) => dedup::purge(&db, args, term).await,
    }
}

/// The outbox a verb works on, and how to name it in messages.
#[derive(Debug)]
pub(crate) struct Place {
    outbox: Outbox,
    /// `"schema"."table" at <url>`.
    description: String,
}

impl Place {
    fn of(db: &Db) -> Result<Place, Failure> {
        let outbox = db.outbox()?;
        let description = format!("{} at {}", outbox.schema().name(), db.url());
        Ok(Place {
            outbox,
            description,
        })
    }

    /// A library error met while doing `what` here.
    fn failed(&self, what: &str, err: &outbox_core::Error) -> Failure {
        Failure::from_library(what, &self.description, err)
    }
}

/// Delete in bounded batches: call `batch_of` (one batch of at most `batch` rows,
/// returning how many it deleted) until a batch comes back short, noting progress
/// between full batches. A failure says how many were deleted before it. Returns the
/// rows deleted and the batches run.
async fn in_batches<F, Fut>(
    term: &Term,
    batch: usize,
    mut batch_of: F,
    failed: impl Fn(&outbox_core::Error) -> Failure,
) -> Result<(u64, u64), Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = outbox_core::Result<u64>>,
{
    let full = u64::try_from(batch).unwrap_or(u64::MAX);
    let (mut deleted, mut batches) = (0u64, 0u64);
    loop {
        let n = batch_of().await.map_err(|e| {
            let mut f = failed(&e);
            if deleted > 0 {
                f.message
                    .push_str(&format!(" ({deleted} deleted before that)"));
            }
            f
        })?;
        batches += 1;
        deleted += n;
        // A short batch means nothing older was left (rows a concurrent purge holds
        // are skipped, and are that purge's to delete).
        if n < full {
            return Ok((deleted, batches));
        }
        term.note(&format!(
            "purged {deleted} so far ({})",
            crate::output::plural(batches, "batch", "batches")
        ));
    }
}
