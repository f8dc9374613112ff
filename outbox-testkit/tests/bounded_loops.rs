//! No suite case can loop without a bound: every `loop` and `while` in `src/suite/`
//! says, in a comment on one of the three lines before it, what bounds it ("Bounded:
//! ..."): a count it cannot pass, or the deadline (`within`, `timeout`, `wait_until`)
//! that awaits it. A case that loops on what a backend returns would otherwise hang
//! the suite instead of failing when the backend is wrong (a claim handing out live
//! leases again, a listing ignoring its cursor, a purge that deletes nothing).
//!
//! Run: `cargo test -p outbox-testkit --test bounded_loops`. It reads files only.

use std::fs;
use std::path::Path;

/// The loops of `text` without a "Bounded" comment on one of the three lines before,
/// as line numbers (from 1).
fn unbounded_loops(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let is_loop = code.starts_with("loop {")
            || code.contains(" loop {")
            || (code.starts_with("while ") && code.trim_end().ends_with('{'));
        if !is_loop {
            continue;
        }
        let said = lines[i.saturating_sub(3)..i]
            .iter()
            .any(|l| l.trim_start().starts_with("//") && l.contains("Bounded"));
        if !said {
            found.push(i + 1);
        }
    }
    found
}

#[test]
fn every_loop_of_the_suite_says_what_bounds_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/suite");
    let mut unbounded = Vec::new();
    let mut files = 0;
    for entry in fs::read_dir(&dir).expect("src/suite") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files += 1;
        let text = fs::read_to_string(&path).expect("a suite file");
        for line in unbounded_loops(&text) {
            unbounded.push(format!("{}:{line}", path.display()));
        }
    }
    assert!(files > 10, "the suite's files were read ({files})");
    assert!(
        unbounded.is_empty(),
        "loops with no `// Bounded: ...` comment on the three lines before them (bound them \
         by a count or a deadline, and say which): {unbounded:?}"
    );
}

#[test]
fn the_check_sees_loops_and_their_comments() {
    let text = "fn f() {\n    loop {\n    }\n    // Bounded: ten turns.\n    while i < 10 {\n    }\n    g();\n    h();\n    let x = loop {\n    };\n}\n";
    assert_eq!(unbounded_loops(text), [2, 9]);
}
