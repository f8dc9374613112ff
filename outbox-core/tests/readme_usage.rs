//! The root README's usage block, checked against the example that compiles and runs
//! it, so the block cannot go stale.
//!
//! The block is the first ```` ```rust ```` block of the README's section
//! `## Using it`. The example `examples/readme-usage/src/main.rs` holds the same lines
//! between two marker comments, each a line of its own:
//!
//! ```text
//! // README: usage begin
//! ...
//! // README: usage end
//! ```
//!
//! The marked lines are compared with the block after removing the begin marker's
//! indentation from each (blank lines may be empty). The example defines what the
//! block takes as given (the pool, the publisher, the shutdown token, the order), so
//! `cargo build -p example-readme-usage` proves the block compiles, and
//! `eval "$(scripts/services.sh)" && cargo run -p example-readme-usage` that it works.
//!
//! Run: `cargo test -p outbox-core --test readme_usage`. It reads files only, so it
//! lives in the crate with the fewest dependencies.

mod workspace;

use workspace::{read, root};

const README: &str = "README.md";
const EXAMPLE: &str = "examples/readme-usage/src/main.rs";
const SECTION: &str = "## Using it";
const BEGIN: &str = "// README: usage begin";
const END: &str = "// README: usage end";

/// The README's usage block: its first line number (1-based, after the fence) and
/// its lines.
fn readme_block(text: &str) -> (usize, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let section = lines
        .iter()
        .position(|l| l.trim_end() == SECTION)
        .unwrap_or_else(|| panic!("{README} has no section `{SECTION}`"));
    let next_section = lines[section + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |i| section + 1 + i);
    let fence = lines[section..next_section]
        .iter()
        .position(|l| l.trim_end() == "```rust")
        .map(|i| section + i)
        .unwrap_or_else(|| panic!("{README}: no ```rust block in the section `{SECTION}`"));
    let end = lines[fence + 1..]
        .iter()
        .position(|l| l.trim_end() == "```")
        .map(|i| fence + 1 + i)
        .unwrap_or_else(|| panic!("{README}:{}: the ```rust block never ends", fence + 1));
    let block = lines[fence + 1..end]
        .iter()
        .map(|l| l.trim_end().to_owned())
        .collect();
    (fence + 2, block)
}

/// The example's marked region: its first line number (1-based, after the begin
/// marker) and its lines without the begin marker's indentation.
fn example_region(text: &str) -> (usize, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let find = |marker: &str| {
        let found: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim() == marker)
            .map(|(i, _)| i)
            .collect();
        match found.as_slice() {
            [one] => *one,
            [] => panic!("{EXAMPLE} has no line `{marker}`"),
            _ => panic!("{EXAMPLE} has `{marker}` {} times: keep one", found.len()),
        }
    };
    let (begin, end) = (find(BEGIN), find(END));
    assert!(begin < end, "{EXAMPLE}: `{END}` comes before `{BEGIN}`");
    let indent = &lines[begin][..lines[begin].len() - lines[begin].trim_start().len()];
    let region = lines[begin + 1..end]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let l = l.trim_end();
            if l.is_empty() {
                String::new()
            } else {
                l.strip_prefix(indent)
                    .unwrap_or_else(|| {
                        panic!("{EXAMPLE}:{}: indented less than `{BEGIN}`", begin + 2 + i)
                    })
                    .to_owned()
            }
        })
        .collect();
    (begin + 2, region)
}

#[test]
fn readme_usage_block_is_the_example_verbatim() {
    let root = root();
    let (readme_line, block) = readme_block(&read(&root.join(README)));
    let (example_line, region) = example_region(&read(&root.join(EXAMPLE)));
    if block == region {
        return;
    }
    let differs = block
        .iter()
        .zip(&region)
        .position(|(a, b)| a != b)
        .unwrap_or(block.len().min(region.len()));
    let shown = |lines: &[String], at: usize| {
        lines
            .get(at)
            .map_or_else(|| "(the block ends)".to_owned(), |l| format!("`{l}`"))
    };
    panic!(
        "\nThe usage block of {README} (section `{SECTION}`) and the lines between \
         `{BEGIN}` and `{END}` in {EXAMPLE} differ:\n  \
         {README}:{}: {}\n  {EXAMPLE}:{}: {}\n\
         Make them the same: edit the README's block and copy it into the example (or the \
         other way round), indented like the markers, then check it still builds and runs \
         with `cargo build -p example-readme-usage` and \
         `eval \"$(scripts/services.sh)\" && cargo run -p example-readme-usage`.\n",
        readme_line + differs,
        shown(&block, differs),
        example_line + differs,
        shown(&region, differs),
    );
}
