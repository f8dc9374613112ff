//! `outbox stats [--watch]`.

use std::time::SystemTime;

use outbox_core::OutboxStats;
use serde::Serialize;

use super::Place;
use crate::cli::StatsArgs;
use crate::fail::Failure;
use crate::output::{fields, human, timestamp, Table, Term};

/// The JSON of one reading.
#[derive(Debug, Serialize)]
struct StatsJson {
    /// When it was read (RFC 3339, UTC).
    at: String,
    pending: u64,
    in_flight: u64,
    dead: u64,
    dispatched: u64,
    /// Milliseconds, `null` when nothing is undelivered.
    oldest_pending_age_ms: Option<u128>,
}

impl StatsJson {
    fn new(stats: &OutboxStats, at: SystemTime) -> StatsJson {
        StatsJson {
            at: timestamp(at),
            pending: stats.pending,
            in_flight: stats.in_flight,
            dead: stats.dead,
            dispatched: stats.dispatched,
            oldest_pending_age_ms: stats.oldest_pending_age.map(|d| d.as_millis()),
        }
    }
}

const COLUMNS: [&str; 6] = [
    "TIME",
    ">PENDING",
    ">IN FLIGHT",
    ">DEAD",
    ">DISPATCHED",
    ">OLDEST PENDING",
];

pub(super) async fn run(place: &Place, args: &StatsArgs, term: &Term) -> Result<(), Failure> {
    let admin = place.outbox.admin();
    let mut reading: u64 = 0;
    loop {
        let stats = admin
            .stats()
            .await
            .map_err(|e| place.failed("reading stats", &e))?;
        let at = SystemTime::now();
        reading += 1;
        if term.json() {
            term.json_out(&StatsJson::new(&stats, at));
        } else if args.watch {
            let mut table = Table::new(&COLUMNS);
            table.row(vec![
                timestamp(at),
                stats.pending.to_string(),
                stats.in_flight.to_string(),
                stats.dead.to_string(),
                stats.dispatched.to_string(),
                oldest(&stats),
            ]);
            let text = table.render();
            // The header once, then one line per reading.
            let (header, line) = text.split_once('\n').unwrap_or(("", &text));
            if reading == 1 {
                term.out(header);
            }
            term.out(line);
        } else {
            term.out(&format!("{}\n", place.description));
            term.out(&fields(&[
                ("pending", stats.pending.to_string()),
                ("in flight", stats.in_flight.to_string()),
                ("dead", stats.dead.to_string()),
                ("dispatched (kept)", stats.dispatched.to_string()),
                ("oldest pending", oldest(&stats)),
            ]));
        }
        if !args.watch || args.count.is_some_and(|n| reading >= n) {
            return Ok(());
        }
        tokio::time::sleep(args.interval).await;
    }
}

/// The age of the oldest undelivered message, or `-`.
fn oldest(stats: &OutboxStats) -> String {
    stats
        .oldest_pending_age
        .map_or_else(|| "-".to_owned(), human)
}
