//! The command line: every verb and option, parsed by clap.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use outbox_core::admin::MAX_ADMIN_BATCH;
use outbox_core::MessageId;

use crate::output::parse_duration;

/// Inspect and repair a transactional outbox on PostgreSQL, SQLite, MySQL/MariaDB, SQL
/// Server or DynamoDB: stats, dead letters, purges, schema.
///
/// Exit codes: 0 done, 1 failed (nothing was changed unless the message says so),
/// 2 bad usage.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every verb takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Database URL: postgres://user:password@host:port/db, sqlite://path/to/file.db
    /// (sqlite:///absolute/path.db), mysql://user:password@host:3306/db (or mariadb://),
    /// sqlserver://user:password@host:1433/db or
    /// dynamodb://host:port (see the README). The password is never printed.
    #[arg(
        long,
        short = 'u',
        env = "OUTBOX_URL",
        global = true,
        hide_env_values = true
    )]
    pub(crate) url: Option<String>,

    /// Schema of the tables on PostgreSQL and SQL Server [default: outbox]. SQLite and
    /// DynamoDB have none.
    #[arg(long, global = true, value_name = "SCHEMA")]
    pub(crate) schema: Option<String>,

    /// Outbox table.
    #[arg(
        long,
        global = true,
        default_value = "outbox_messages",
        value_name = "TABLE"
    )]
    pub(crate) table: String,

    /// Inbox (dedup) table, for `dedup purge` and `schema --inbox`.
    #[arg(
        long,
        global = true,
        default_value = "outbox_inbox",
        value_name = "TABLE"
    )]
    pub(crate) inbox_table: String,

    /// Print JSON for scripts instead of tables (one document per line).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// How long to wait for the database to answer when connecting.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) connect_timeout: Duration,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Counts: pending, in flight, dead, dispatched (kept), age of the oldest pending.
    Stats(StatsArgs),
    /// List, show, requeue or discard dead letters.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Delete dispatched messages kept as history, in bounded batches.
    Purge(PurgeArgs),
    /// Print or install the tables.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Maintain a consumer's inbox (dedup) table.
    #[command(subcommand)]
    Dedup(DedupCommand),
}

/// `stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Refresh until interrupted (or `--count` times), one line per refresh.
    #[arg(long, short = 'w')]
    pub(crate) watch: bool,
    /// Time between refreshes.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION", requires = "watch")]
    pub(crate) interval: Duration,
    /// Stop after this many refreshes.
    #[arg(long, value_name = "N", requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) count: Option<u64>,
}

/// `dead ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// List dead letters, a page at a time.
    List(ListArgs),
    /// Show one dead letter: headers, attempts, last error, payload.
    Show(ShowArgs),
    /// Make dead letters due again, their attempt count reset (asks first).
    Requeue(ChangeArgs),
    /// Delete dead letters for good (asks first).
    Discard(ChangeArgs),
}

/// Which dead letters, by their content.
#[derive(Debug, Args, Clone)]
pub(crate) struct FilterArgs {
    /// Only dead letters for this destination (exact match).
    #[arg(long, short = 'd', value_name = "DESTINATION")]
    pub(crate) destination: Option<String>,
    /// Only dead letters that died at least this long ago (e.g. 30m, 2h, 7d).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) dead_for: Option<Duration>,
}

/// `dead list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Dead letters per page.
    #[arg(long, short = 'n', default_value_t = 20, value_parser = batch_size)]
    pub(crate) limit: usize,
    /// Start after this id (the last one of the previous page).
    #[arg(long, value_parser = parse_id, value_name = "ID")]
    pub(crate) after: Option<MessageId>,
    /// Newest message first (by id, that is by enqueue time) instead of oldest first.
    #[arg(long)]
    pub(crate) newest_first: bool,
}

/// `dead show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The dead letter's id.
    #[arg(value_parser = parse_id)]
    pub(crate) id: MessageId,
    /// Print the whole payload instead of its first bytes.
    #[arg(long)]
    pub(crate) full: bool,
}

/// `dead requeue` and `dead discard`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["ids", "all"])))]
pub(crate) struct ChangeArgs {
    /// The dead letters' ids.
    #[arg(value_parser = parse_id, value_name = "ID", num_args = 1..=MAX_ADMIN_BATCH)]
    pub(crate) ids: Vec<MessageId>,
    /// Every dead letter (matching --destination / --dead-for), in batches.
    #[arg(long, conflicts_with = "ids")]
    pub(crate) all: bool,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
    /// Dead letters per statement with --all.
    #[arg(long, default_value_t = 1000, value_parser = batch_size)]
    pub(crate) batch: usize,
}

/// `purge`.
#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    /// Delete dispatched messages completed more than this long ago (e.g. 7d, 12h; 0s
    /// for all).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) older_than: Duration,
    /// Rows per statement.
    #[arg(long, default_value_t = 1000, value_parser = batch_size)]
    pub(crate) batch: usize,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `schema ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum SchemaCommand {
    /// Print the DDL (idempotent) for your migration tool.
    Print(SchemaArgs),
    /// Create the tables and indexes if missing (safe to repeat).
    Install(SchemaArgs),
}

/// Which table's schema.
#[derive(Debug, Args)]
pub(crate) struct SchemaArgs {
    /// The inbox (dedup) table instead of the outbox table.
    #[arg(long)]
    pub(crate) inbox: bool,
}

/// `dedup ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DedupCommand {
    /// Delete inbox records older than the consumer's retention, in bounded batches.
    Purge(DedupPurgeArgs),
}

/// `dedup purge`.
#[derive(Debug, Args)]
pub(crate) struct DedupPurgeArgs {
    /// The consumer's retention: records older than this are deleted (e.g. 7d). Never
    /// less than the longest time your broker may redeliver a message. On DynamoDB
    /// each record carries the expiry its consumer wrote with it: the purge deletes
    /// records past that expiry (ahead of DynamoDB's own TTL deletion), and this value
    /// only has to be valid.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) older_than: Duration,
    /// Rows per statement.
    #[arg(long, default_value_t = 1000, value_parser = batch_size)]
    pub(crate) batch: usize,
}

fn parse_id(text: &str) -> Result<MessageId, String> {
    text.trim().parse::<MessageId>().map_err(|_| {
        format!(
            "`{text}` is not a message id (a UUID such as 0190b5e2-6c1d-7a3e-9f00-1234567890ab)"
        )
    })
}

fn batch_size(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_ADMIN_BATCH).contains(&n) => Ok(n),
        _ => Err(format!("expected a number from 1 to {MAX_ADMIN_BATCH}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn ids_and_batches_are_checked() {
        let id = MessageId::new();
        assert_eq!(parse_id(&id.to_string()).unwrap(), id);
        assert!(parse_id("17").unwrap_err().contains("not a message id"));
        assert_eq!(batch_size("10000").unwrap(), 10_000);
        assert!(batch_size("0").is_err());
        assert!(batch_size("10001").is_err());
    }

    #[test]
    fn requeue_needs_ids_or_all_but_not_both() {
        let parse = |args: &[&str]| Cli::try_parse_from(["outbox"].iter().chain(args));
        assert!(parse(&["dead", "requeue"]).is_err());
        assert!(parse(&["dead", "requeue", "--all"]).is_ok());
        let id = MessageId::new().to_string();
        assert!(parse(&["dead", "requeue", &id]).is_ok());
        assert!(parse(&["dead", "requeue", "--all", &id]).is_err());
        assert!(
            parse(&["stats", "--count", "3"]).is_err(),
            "--count needs --watch"
        );
    }
}
