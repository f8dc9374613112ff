//! The suite macros list their cases by hand (`macro_rules!` cannot enumerate a
//! module's functions): this test keeps each list equal to the cases `src/suite/`
//! defines for its harness, so a new case cannot be written and never run, and a
//! removed one cannot linger in a list.

use std::collections::BTreeSet;
use std::path::Path;

/// Each harness trait and the macro that runs its cases.
const SUITES: &[(&str, &str, &str)] = &[
    ("Harness", "conformance_suite", "macros.rs"),
    ("DedupHarness", "dedup_suite", "dedup_macros.rs"),
    ("LockHarness", "lock_suite", "dedup_macros.rs"),
    ("ConsumerHarness", "consumer_suite", "dedup_macros.rs"),
    ("PublisherHarness", "publisher_suite", "publisher_macros.rs"),
];

/// Helpers in `src/suite/` that take a harness but are not cases of their own.
const NOT_CASES: &[&str] = &["article_race"];

fn src(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// `(case, harness trait)` for every `pub async fn` of `src/suite/` whose first
/// parameter is a harness (`h: &dyn X`, or `harness: &H` with `H: X`).
fn defined_cases() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/suite");
    let mut cases = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for piece in text.split("pub async fn ").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let signature = &piece[..piece.find(')').unwrap_or(piece.len())];
            let harness = if let Some(at) = signature.find("&dyn ") {
                Some(&signature[at + 5..])
            } else {
                signature.find("<H: ").map(|at| &signature[at + 4..])
            };
            if let Some(harness) = harness {
                let harness: String = harness
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !NOT_CASES.contains(&name.as_str()) {
                    cases.push((name, harness));
                }
            }
        }
    }
    cases
}

/// Every case `name!` lists: the identifiers of its `$crate::name!(@...; a, b, ...)`
/// invocations.
fn listed_cases(file: &str, name: &str) -> BTreeSet<String> {
    let text = src(file);
    let start = text
        .find(&format!("macro_rules! {name} "))
        .unwrap_or_else(|| panic!("no macro {name} in {file}"));
    let body = &text[start..];
    let body = &body[..body.find("\n}\n").unwrap_or(body.len())];
    let mut listed = BTreeSet::new();
    let call = format!("$crate::{name}!(@");
    for piece in body.split(call.as_str()).skip(1) {
        let list = &piece[piece.find("$make;").expect("a case list") + 6..];
        let list = &list[..list.find(')').unwrap()];
        listed.extend(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty() && !s.starts_with('$'))
                .map(str::to_owned),
        );
    }
    listed
}

#[test]
fn every_suite_macro_lists_exactly_the_cases_of_its_harness() {
    let defined = defined_cases();
    assert!(
        defined.len() > 60,
        "the parser found {} cases",
        defined.len()
    );
    for (harness, name, file) in SUITES {
        let want: BTreeSet<String> = defined
            .iter()
            .filter(|(_, h)| h == harness)
            .map(|(case, _)| case.clone())
            .collect();
        let listed = listed_cases(file, name);
        let never_run: Vec<_> = want.difference(&listed).collect();
        let unknown: Vec<_> = listed.difference(&want).collect();
        assert!(
            never_run.is_empty() && unknown.is_empty(),
            "{name}!: cases defined for {harness} but not listed: {never_run:?}; listed but \
             not defined for {harness}: {unknown:?}"
        );
    }
}
