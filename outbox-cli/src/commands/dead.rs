//! `outbox dead list | show | requeue | discard`.

use std::collections::BTreeMap;

use base64::Engine as _;
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, DeadLetterSelection, MessageId,
};
use serde::Serialize;

use super::Place;
use crate::cli::{ChangeArgs, FilterArgs, ListArgs, ShowArgs};
use crate::fail::Failure;
use crate::output::{ago, fields, human, one_line, plural, sanitize, timestamp, Table, Term};

/// How much of a payload `dead show` prints without `--full`.
const PREVIEW_BYTES: usize = 1024;

/// A dead letter as JSON.
#[derive(Debug, Serialize)]
struct LetterJson {
    id: String,
    destination: String,
    partition_key: Option<String>,
    content_type: Option<String>,
    headers: BTreeMap<String, String>,
    attempts: u32,
    last_error: Option<String>,
    created_at: String,
    dead_at: String,
    payload_bytes: usize,
    /// The whole payload (`dead show` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
    /// The payload as text, when it is UTF-8 (`dead show` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_text: Option<String>,
}

impl LetterJson {
    fn new(letter: &DeadLetter, with_payload: bool) -> LetterJson {
        let m = &letter.message;
        LetterJson {
            id: m.id.to_string(),
            destination: m.destination.clone(),
            partition_key: m.partition_key.clone(),
            content_type: m.content_type.clone(),
            headers: m
                .headers
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            attempts: m.attempts,
            last_error: m.last_error.clone(),
            created_at: timestamp(m.created_at),
            dead_at: timestamp(letter.dead_at),
            payload_bytes: m.payload.len(),
            payload_base64: with_payload
                .then(|| base64::engine::general_purpose::STANDARD.encode(&m.payload)),
            payload_text: with_payload
                .then(|| String::from_utf8(m.payload.clone()).ok())
                .flatten(),
        }
    }
}

/// A page of `dead list` as JSON.
#[derive(Debug, Serialize)]
struct ListJson {
    /// Dead letters matching the filter, in all.
    total: u64,
    order: &'static str,
    dead_letters: Vec<LetterJson>,
    /// Pass as `--after` for the next page; `null` on the last page.
    next_after: Option<String>,
}

/// The library filter for the command line's.
fn filter(args: &FilterArgs) -> Result<DeadLetterFilter, Failure> {
    let mut filter = DeadLetterFilter::default();
    if let Some(destination) = &args.destination {
        filter = filter
            .with_destination(destination)
            .map_err(|e| Failure::usage(format!("--destination: {}", e.report())))?;
    }
    if let Some(age) = args.dead_for {
        filter = filter.with_dead_for(age);
    }
    Ok(filter)
}

/// "for destination X, dead at least 2h" or "".
fn describe(args: &FilterArgs) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &args.destination {
        parts.push(format!("for destination {}", sanitize(d)));
    }
    if let Some(age) = args.dead_for {
        parts.push(format!("dead for at least {}", human(age)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" {}", parts.join(", "))
    }
}

/// A table of dead letters, one line each.
fn table(letters: &[DeadLetter]) -> String {
    let mut table = Table::new(&["ID", "DESTINATION", ">ATTEMPTS", ">DEAD FOR", "LAST ERROR"]);
    for letter in letters {
        let m = &letter.message;
        table.row(vec![
            m.id.to_string(),
            sanitize(&m.destination),
            m.attempts.to_string(),
            ago(letter.dead_at),
            one_line(m.last_error.as_deref().unwrap_or("-"), 60),
        ]);
    }
    table.render()
}

pub(super) async fn list(place: &Place, args: &ListArgs, term: &Term) -> Result<(), Failure> {
    let admin = place.outbox.admin();
    let filter = filter(&args.filter)?;
    let order = if args.newest_first {
        DeadLetterOrder::Descending
    } else {
        DeadLetterOrder::Ascending
    };
    let mut page = DeadLetterPage::new(filter.clone(), args.limit)
        .map_err(|e| Failure::usage(e.report().to_string()))?
        .with_order(order);
    if let Some(after) = args.after {
        page = page.after(after);
    }
    let failed = |e| place.failed("listing dead letters", &e);
    let total = admin.count_dead(&filter).await.map_err(failed)?;
    let letters = admin.dead_letters(&page).await.map_err(failed)?;
    let next_after = (letters.len() == args.limit)
        .then(|| letters.last().map(|l| l.message.id))
        .flatten();
    if term.json() {
        term.json_out(&ListJson {
            total,
            order: if args.newest_first {
                "newest_first"
            } else {
                "oldest_first"
            },
            dead_letters: letters.iter().map(|l| LetterJson::new(l, false)).collect(),
            next_after: next_after.map(|id| id.to_string()),
        });
        return Ok(());
    }
    let what = format!(
        "{}{}",
        plural(total, "dead letter", "dead letters"),
        describe(&args.filter)
    );
    if letters.is_empty() {
        term.out(&format!(
            "{} in {}; none on this page",
            what, place.description
        ));
        return Ok(());
    }
    term.out(&table(&letters));
    let order = if args.newest_first {
        "newest first"
    } else {
        "oldest first"
    };
    let mut footer = format!("\n{} of {what} ({order})", letters.len());
    if let Some(id) = next_after {
        footer.push_str(&format!("; next page: --after {id}"));
    }
    term.out(&footer);
    Ok(())
}

/// The dead letters among `ids` (all of them when they all are dead letters).
async fn find(place: &Place, ids: &[MessageId]) -> Result<Vec<DeadLetter>, Failure> {
    let filter = DeadLetterFilter::default()
        .with_ids(ids.iter().copied())
        .map_err(|e| Failure::usage(e.report().to_string()))?;
    let page = DeadLetterPage::new(filter, ids.len().max(1))
        .map_err(|e| Failure::usage(e.report().to_string()))?;
    place
        .outbox
        .admin()
        .dead_letters(&page)
        .await
        .map_err(|e| place.failed("looking up dead letters", &e))
}

pub(super) async fn show(place: &Place, args: &ShowArgs, term: &Term) -> Result<(), Failure> {
    let Some(letter) = find(place, &[args.id]).await?.pop() else {
        return Err(Failure::error(format!(
            "no dead letter with id {} in {}",
            args.id, place.description
        ))
        .hint("it may have been requeued or discarded, or never died; `outbox dead list` shows the dead letters"));
    };
    if term.json() {
        term.json_out(&LetterJson::new(&letter, true));
        return Ok(());
    }
    let m = &letter.message;
    let optional = |v: &Option<String>| v.as_deref().map_or_else(|| "-".to_owned(), sanitize);
    let mut text = fields(&[
        ("id", m.id.to_string()),
        ("destination", sanitize(&m.destination)),
        ("partition key", optional(&m.partition_key)),
        ("content type", optional(&m.content_type)),
        (
            "created",
            format!("{} ({} ago)", timestamp(m.created_at), ago(m.created_at)),
        ),
        (
            "dead since",
            format!(
                "{} ({} ago)",
                timestamp(letter.dead_at),
                ago(letter.dead_at)
            ),
        ),
        ("attempts", m.attempts.to_string()),
        ("last error", optional(&m.last_error)),
    ]);
    if m.headers.is_empty() {
        text.push_str("\nheaders        -");
    } else {
        text.push_str("\nheaders");
        let pairs: Vec<(&str, String)> = m.headers.iter().map(|(k, v)| (k, sanitize(v))).collect();
        for line in fields(&pairs).lines() {
            text.push_str(&format!("\n  {}", sanitize(line)));
        }
    }
    text.push_str(&format!("\n{}", payload(&m.payload, args.full)));
    term.out(&text);
    Ok(())
}

/// The payload for people: text when it is UTF-8, else a hex dump; the first
/// [`PREVIEW_BYTES`] unless `full`.
fn payload(bytes: &[u8], full: bool) -> String {
    let size = plural(bytes.len() as u64, "byte", "bytes");
    let text = std::str::from_utf8(bytes).ok();
    let mut shown = if full {
        bytes.len()
    } else {
        bytes.len().min(PREVIEW_BYTES)
    };
    if let Some(text) = text {
        while !text.is_char_boundary(shown) {
            shown -= 1;
        }
    }
    let more = bytes.len() - shown;
    let tail = if more > 0 {
        format!(
            "\n  … {} more (--full prints all)",
            plural(more as u64, "byte", "bytes")
        )
    } else {
        String::new()
    };
    let body: Vec<String> = match text {
        Some(text) => sanitize(&text[..shown])
            .lines()
            .map(|l| format!("  {l}"))
            .collect(),
        None => bytes[..shown]
            .chunks(16)
            .enumerate()
            .map(|(i, chunk)| {
                let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
                format!("  {:08x}  {}", i * 16, hex.join(" "))
            })
            .collect(),
    };
    let kind = if text.is_some() {
        "UTF-8 text"
    } else {
        "binary"
    };
    format!("payload        {size}, {kind}\n{}{tail}", body.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_preview_as_text_or_hex() {
        let text = "é".repeat(PREVIEW_BYTES); // two bytes each
        let shown = payload(text.as_bytes(), false);
        assert!(shown.starts_with("payload        2048 bytes, UTF-8 text\n  é"));
        assert!(
            shown.ends_with("… 1024 bytes more (--full prints all)"),
            "{shown}"
        );
        assert!(!payload(text.as_bytes(), true).contains("more"));
        // 1024 bytes would split an é: the preview stops before it.
        let odd = format!("a{text}");
        assert!(payload(odd.as_bytes(), false).ends_with("… 1026 bytes more (--full prints all)"));
        let binary = payload(&[0xff; 20], false);
        assert_eq!(
            binary,
            "payload        20 bytes, binary\n  00000000  ff ff ff ff ff ff ff ff ff ff ff ff \
             ff ff ff ff\n  00000010  ff ff ff ff"
        );
    }
}

/// What `requeue` and `discard` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Requeue,
    Discard,
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Change::Requeue => "requeue",
            Change::Discard => "discard",
        }
    }
    fn done(self) -> &'static str {
        match self {
            Change::Requeue => "requeued",
            Change::Discard => "discarded",
        }
    }
    fn question(self) -> &'static str {
        match self {
            Change::Requeue => "Requeue (make due again, attempts reset to 0)",
            Change::Discard => "Discard (delete for good)",
        }
    }
}

/// What `requeue` / `discard` did, as JSON.
#[derive(Debug, Serialize)]
struct ChangeJson {
    action: &'static str,
    /// Dead letters selected when asked.
    matched: u64,
    /// Dead letters changed.
    changed: u64,
}

pub(super) async fn change(
    place: &Place,
    change: Change,
    args: &ChangeArgs,
    term: &Term,
) -> Result<(), Failure> {
    let admin = place.outbox.admin();
    let failed = |e| place.failed(&format!("{} dead letters", change.verb()), &e);
    let filter = filter(&args.filter)?;
    let (matched, changed) = if args.all {
        let matched = admin.count_dead(&filter).await.map_err(failed)?;
        let what = match matched {
            1 => format!("the 1 dead letter{}", describe(&args.filter)),
            n => format!("all {n} dead letters{}", describe(&args.filter)),
        };
        if matched == 0 {
            term.note(&format!(
                "no dead letters{} in {}; nothing to {}",
                describe(&args.filter),
                place.description,
                change.verb()
            ));
            (0, 0)
        } else {
            confirm(
                term,
                args.yes,
                change,
                &format!("{what} in {}", place.description),
            )?;
            let mut changed = 0;
            while changed < matched {
                let limit = usize::try_from(matched - changed)
                    .map_or(args.batch, |left| left.min(args.batch));
                let selection = DeadLetterSelection::Matching {
                    filter: filter.clone(),
                    limit,
                };
                let n = match change {
                    Change::Requeue => admin.requeue_dead(&selection).await,
                    Change::Discard => admin.discard_dead(&selection).await,
                }
                .map_err(|e| {
                    let mut f = failed(e);
                    if changed > 0 {
                        f.message.push_str(&format!(
                            " ({} {changed} of {matched} before that)",
                            change.done()
                        ));
                    }
                    f
                })?;
                if n == 0 {
                    break;
                }
                changed += n;
                if changed < matched {
                    term.note(&format!("{} {changed} of {matched}", change.done()));
                }
            }
            (matched, changed)
        }
    } else {
        if args.filter.destination.is_some() || args.filter.dead_for.is_some() {
            return Err(Failure::usage(
                "--destination and --dead-for go with --all, not with ids",
            ));
        }
        let found = find(place, &args.ids).await?;
        let mut missing: Vec<MessageId> = args.ids.clone();
        missing.sort();
        missing.dedup();
        let wanted = missing.len();
        missing.retain(|id| !found.iter().any(|l| l.message.id == *id));
        if !missing.is_empty() {
            let shown: Vec<String> = missing.iter().take(10).map(ToString::to_string).collect();
            let more = if missing.len() > 10 { ", ..." } else { "" };
            let which = match (missing.len(), wanted) {
                (1, 1) => format!("{} is not a dead letter", shown[0]),
                (1, _) => format!("{} (1 of the {wanted} ids) is not a dead letter", shown[0]),
                (n, _) => format!(
                    "{n} of the {wanted} ids are not dead letters ({}{more})",
                    shown.join(", ")
                ),
            };
            return Err(Failure::error(format!(
                "{which} in {}; nothing was {}",
                place.description,
                change.done(),
            ))
            .hint("check the ids with `outbox dead list`; requeued or discarded ones are gone from it"));
        }
        if !args.yes {
            term.note(&table(&found));
        }
        let what = match found.len() {
            1 => "this dead letter".to_owned(),
            n => format!("these {n} dead letters"),
        };
        confirm(
            term,
            args.yes,
            change,
            &format!("{what} in {}", place.description),
        )?;
        let ids: Vec<MessageId> = found.iter().map(|l| l.message.id).collect();
        let selection = DeadLetterSelection::Ids(ids);
        let n = match change {
            Change::Requeue => admin.requeue_dead(&selection).await,
            Change::Discard => admin.discard_dead(&selection).await,
        }
        .map_err(failed)?;
        (found.len() as u64, n)
    };
    if term.json() {
        term.json_out(&ChangeJson {
            action: change.done(),
            matched,
            changed,
        });
    } else if matched > 0 {
        let mut line = format!(
            "{} {}",
            change.done(),
            plural(changed, "dead letter", "dead letters")
        );
        if changed < matched {
            line.push_str(&format!(
                " of {matched} (the others were requeued, discarded or changed meanwhile)"
            ));
        }
        term.out(&line);
    }
    Ok(())
}

/// Ask before changing `what`, unless `yes`; declining is a failure that changed
/// nothing.
fn confirm(term: &Term, yes: bool, change: Change, what: &str) -> Result<(), Failure> {
    if yes || term.confirm(&format!("{} {what}?", change.question())) {
        return Ok(());
    }
    Err(
        Failure::error(format!("not confirmed; nothing was {}", change.done()))
            .hint("answer y to go ahead, or pass --yes (for scripts)"),
    )
}
