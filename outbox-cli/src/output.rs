//! Printing: redacted lines, aligned tables, durations and times for people, JSON for
//! scripts, and the confirmation question.

use std::io::{BufRead, Write};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::fail::Failure;
use crate::target::Secrets;

/// Where everything printed goes: stdout for results, stderr for progress, questions
/// and errors. Every line passes through [`Secrets::redact`].
#[derive(Debug)]
pub(crate) struct Term {
    secrets: Secrets,
    json: bool,
}

impl Term {
    pub(crate) fn new(secrets: Secrets, json: bool) -> Term {
        Term { secrets, json }
    }

    /// Whether results are printed as JSON.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    pub(crate) fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// A result line (or block) on stdout.
    pub(crate) fn out(&self, text: &str) {
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`| head`) is not worth a panic.
        let _ = writeln!(stdout, "{}", self.secrets.redact(text));
        let _ = stdout.flush();
    }

    /// A progress or information line on stderr.
    pub(crate) fn note(&self, text: &str) {
        eprintln!("{}", self.secrets.redact(text));
    }

    /// `value` as one line of JSON on stdout.
    pub(crate) fn json_out<T: Serialize>(&self, value: &T) {
        let text = serde_json::to_string(value).expect("CLI values serialise");
        self.out(&text);
    }

    /// A failure on stderr.
    pub(crate) fn failure(&self, failure: &Failure) {
        self.note(&format!("error: {}", failure.message));
        if let Some(hint) = &failure.hint {
            self.note(&format!("hint: {hint}"));
        }
    }

    /// Ask `question` on stderr and read the answer from stdin: only `y` or `yes`
    /// agrees; anything else, or no input at all (a script's closed stdin), declines.
    pub(crate) fn confirm(&self, question: &str) -> bool {
        eprint!("{} [y/N] ", self.secrets.redact(question));
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        match std::io::stdin().lock().read_line(&mut answer) {
            Ok(0) | Err(_) => {
                eprintln!();
                false
            }
            Ok(_) => matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        }
    }
}

/// Text columns aligned for people: numbers right, text left, the last column unpadded.
#[derive(Debug)]
pub(crate) struct Table {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these headers; a header starting with `>` is right-aligned.
    pub(crate) fn new(header: &[&str]) -> Table {
        Table {
            header: header
                .iter()
                .map(|h| h.trim_start_matches('>').to_owned())
                .collect(),
            right: header.iter().map(|h| h.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let last = c + 1 == row.len();
                let pad = widths[c] - cell.chars().count();
                if c > 0 {
                    line.push_str("  ");
                }
                if self.right[c] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if !last {
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.pop();
        out
    }
}

/// Pairs of label and value, the labels aligned.
pub(crate) fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(label, value)| format!("{label:<width$}  {value}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Stored text made safe for a terminal: control characters other than newline and
/// tab are escaped, so a payload or error cannot move the cursor or change colours.
pub(crate) fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The first line of `text`, at most `max` characters, marked when cut.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or("");
    let cut = first.chars().count() > max || text.lines().nth(1).is_some();
    let mut line: String = sanitize(first).chars().take(max).collect();
    if cut {
        line.push('…');
    }
    line
}

/// A time as RFC 3339 UTC, to the millisecond.
pub(crate) fn timestamp(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// How long ago `time` was, for people (`4m 12s`).
pub(crate) fn ago(time: SystemTime) -> String {
    SystemTime::now()
        .duration_since(time)
        .map_or_else(|_| "0s".to_owned(), human)
}

/// A duration for people: its largest unit and the next one (`3d 4h`, `4m 12s`,
/// `1h`, `850ms`).
pub(crate) fn human(d: Duration) -> String {
    const UNITS: [(&str, u64); 4] = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let secs = d.as_secs();
    let Some(i) = UNITS.iter().position(|(_, size)| secs >= *size) else {
        return match d.subsec_millis() {
            0 => "0s".to_owned(),
            ms => format!("{ms}ms"),
        };
    };
    let (unit, size) = UNITS[i];
    let mut text = format!("{}{unit}", secs / size);
    if let Some((next, next_size)) = UNITS.get(i + 1) {
        let n = secs % size / next_size;
        if n > 0 {
            text.push_str(&format!(" {n}{next}"));
        }
    }
    text
}

/// Read a duration: `0`, or numbers with units `ms`, `s`, `m`, `h`, `d`, `w`
/// (`90s`, `1h30m`, `7d`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not a duration (use e.g. 30s, 15m, 2h, 7d, 1h30m)");
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3_600),
            "d" => Duration::from_secs(86_400),
            "w" => Duration::from_secs(7 * 86_400),
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        let n = u32::try_from(n).map_err(|_| bad())?;
        total = unit
            .checked_mul(n)
            .and_then(|d| total.checked_add(d))
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// `count` and the noun, singular or plural.
pub(crate) fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print() {
        let d = |s| parse_duration(s).unwrap();
        assert_eq!(d("0"), Duration::ZERO);
        assert_eq!(d("0s"), Duration::ZERO);
        assert_eq!(d("90s"), Duration::from_secs(90));
        assert_eq!(d("1h30m"), Duration::from_secs(5400));
        assert_eq!(d("7d"), Duration::from_secs(7 * 86_400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("2w"), Duration::from_secs(14 * 86_400));
        for bad in ["", "7", "d", "7x", "1.5h", "-1s", "99999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(Duration::from_secs(252)), "4m 12s");
        assert_eq!(
            human(Duration::from_secs(3 * 86_400 + 4 * 3600 + 5)),
            "3d 4h"
        );
        assert_eq!(human(Duration::from_secs(7200)), "2h");
        assert_eq!(human(Duration::from_secs(3605)), "1h");
    }

    #[test]
    fn tables_align_and_text_is_made_safe() {
        let mut t = Table::new(&["ID", ">N", "NOTE"]);
        t.row(vec!["a".into(), "5".into(), "x".into()]);
        t.row(vec!["bbb".into(), "120".into(), "".into()]);
        assert_eq!(t.render(), "ID     N  NOTE\na      5  x\nbbb  120");
        assert_eq!(sanitize("a\u{1b}[31mb\tc\n"), "a\\u{1b}[31mb\tc\n");
        assert_eq!(one_line("first\nsecond", 20), "first…");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(one_line("abc", 3), "abc");
        assert_eq!(
            fields(&[("a", "1".into()), ("long", "2".into())]),
            "a     1\nlong  2"
        );
        assert_eq!(plural(1, "dead letter", "dead letters"), "1 dead letter");
    }
}
