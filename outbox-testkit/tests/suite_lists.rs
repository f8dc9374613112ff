//! The suite macros list their cases by hand (`macro_rules!` cannot enumerate a
//! module's functions): this test keeps each list equal to the cases `src/suite/`
//! defines for its harness, so a new case cannot be written and never run, and a
//! removed one cannot linger in a list. It also keeps each case in the capability
//! group of what it `require`s, so a backend lacking that capability sees the case as
//! ignored rather than failing.

use std::collections::BTreeMap;
use std::path::Path;

/// Each harness trait and the macro that runs its cases.
const SUITES: &[(&str, &str, &str)] = &[
    ("Harness", "conformance_suite", "macros.rs"),
    ("DedupHarness", "dedup_suite", "dedup_macros.rs"),
    ("LockHarness", "lock_suite", "dedup_macros.rs"),
    ("ConsumerHarness", "consumer_suite", "dedup_macros.rs"),
    ("PublisherHarness", "publisher_suite", "publisher_macros.rs"),
    ("PlanHarness", "plan_suite", "plan_macros.rs"),
];

/// Helpers in `src/suite/` that take a harness but are not cases of their own.
const NOT_CASES: &[&str] = &["article_race"];

fn src(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// A case defined in `src/suite/`: its harness trait and the capability it requires
/// (`always` when none).
#[derive(Debug)]
struct Case {
    name: String,
    harness: String,
    needs: String,
}

/// Every `pub async fn` of `src/suite/` whose first parameter is a harness (`h: &dyn
/// X`, or `harness: &H` with `H: X`).
fn defined_cases() -> Vec<Case> {
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
            let Some(harness) = harness else { continue };
            if NOT_CASES.contains(&name.as_str()) {
                continue;
            }
            let harness: String = harness
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            cases.push(Case {
                needs: required(piece),
                name,
                harness,
            });
        }
    }
    cases
}

/// The capability a case body requires: the string of its `require(.., "cap")`, or
/// `lease_renewal` for the renewal cases' `renewing(h)`.
fn required(body: &str) -> String {
    if body.contains("renewing(h)") {
        return "lease_renewal".to_owned();
    }
    match body.find("require(") {
        Some(at) => {
            let rest = &body[at..];
            let open = rest.find('"').expect("require names its capability") + 1;
            let close = rest[open..].find('"').unwrap() + open;
            rest[open..close].to_owned()
        }
        None => "always".to_owned(),
    }
}

/// Every case `name!` lists, with the capability group it is listed in: the
/// identifiers of its `$crate::__suite_group!([..] cap; $make; how; a, b, ...)` calls.
fn listed_cases(file: &str, name: &str) -> BTreeMap<String, String> {
    let text = src(file);
    let start = text
        .find(&format!("macro_rules! {name} "))
        .unwrap_or_else(|| panic!("no macro {name} in {file}"));
    let body = &text[start..];
    let body = &body[..body.find("\n}\n").unwrap_or(body.len())];
    let mut listed = BTreeMap::new();
    for piece in body.split("$crate::__suite_group!(").skip(1) {
        let group = &piece[piece.find(']').expect("the lacked list") + 1..];
        let group = group[..group.find(';').unwrap()].trim().to_owned();
        let list = &piece[piece.find("$make;").expect("a case list") + 6..];
        let list = &list[list.find(';').expect("how the cases run") + 1..];
        let list = &list[..list.find(')').unwrap()];
        for case in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            listed.insert(case.to_owned(), group.clone());
        }
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
        let want: BTreeMap<&str, &str> = defined
            .iter()
            .filter(|c| c.harness == *harness)
            .map(|c| (c.name.as_str(), c.needs.as_str()))
            .collect();
        let listed = listed_cases(file, name);
        let never_run: Vec<_> = want.keys().filter(|c| !listed.contains_key(**c)).collect();
        let unknown: Vec<_> = listed
            .keys()
            .filter(|c| !want.contains_key(c.as_str()))
            .collect();
        assert!(
            never_run.is_empty() && unknown.is_empty(),
            "{name}!: cases defined for {harness} but not listed: {never_run:?}; listed but \
             not defined for {harness}: {unknown:?}"
        );
        let misgrouped: Vec<_> = listed
            .iter()
            .filter(|(case, group)| want[case.as_str()] != group.as_str())
            .map(|(case, group)| {
                format!(
                    "{case} requires {} but is listed under {group}",
                    want[case.as_str()]
                )
            })
            .collect();
        assert!(misgrouped.is_empty(), "{name}!: {misgrouped:?}");
    }
}

#[test]
fn the_parser_reads_groups_and_requirements() {
    let listed = listed_cases("macros.rs", "conformance_suite");
    assert_eq!(listed["settle_and_claim_skips_locked_rows"], "row_locks");
    assert_eq!(
        listed["relay_renews_leases_across_publish_waves"],
        "lease_renewal"
    );
    assert_eq!(listed["stats_are_exact"], "always");
    let defined = defined_cases();
    let needs = |name: &str| &defined.iter().find(|c| c.name == name).unwrap().needs;
    assert_eq!(
        needs("claim_skips_rows_locked_by_another_transaction"),
        "row_locks"
    );
    assert_eq!(needs("unrenewed_lease_lapses_at_expiry"), "lease_renewal");
    assert_eq!(needs("lock_severed_session_releases_the_lock"), "sever");
    assert_eq!(needs("enqueued_fields_round_trip"), "always");
}
