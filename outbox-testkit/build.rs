//! Build script: generates `__suite_cases!`, the suite macros' case lists, from the
//! cases `src/suite/` defines (see `build/cases.rs`), so a case written there is run by
//! every backend's suite, in the group of the capability it requires, with nothing to
//! list by hand.

#[path = "build/cases.rs"]
mod cases;

use std::path::Path;

fn main() {
    let dir = Path::new("src/suite");
    println!("cargo::rerun-if-changed={}", dir.display());
    println!("cargo::rerun-if-changed=build/cases.rs");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("src/suite")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    let mut all = Vec::new();
    for path in &files {
        println!("cargo::rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(path).expect("a suite file");
        all.extend(cases::cases_of(&text));
    }
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("suite_cases.rs");
    std::fs::write(out, cases::render(&all)).expect("writing suite_cases.rs");
}
