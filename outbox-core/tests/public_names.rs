//! The public names at the root of `outbox_core` and of the `outbox` facade, read from
//! their `lib.rs`, against the lists below: a name added to (or dropped from) either
//! root is a deliberate change to what every user sees, made here as well.
//!
//! The root is what a service uses: messages, the relay, consumers' stores, config,
//! errors and the store traits it passes around. Contract plumbing (claims, leases,
//! settles) lives under `outbox_core::store`, tools' traits under their modules, and
//! what a backend author needs under `outbox_core::backend`, which the facade does not
//! re-export. Macros exported with `#[macro_export]` land at the root whatever module
//! defines them, so they must be `#[doc(hidden)]` there and re-exported from `backend`.
//!
//! Run: `cargo test -p outbox-core --test public_names`. It reads files only.

mod workspace;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use workspace::{read, root};

/// The names re-exported at `outbox_core`'s root (and, the same, at the facade's).
const ROOT_NAMES: &[&str] = &[
    // messages
    "Headers",
    "Message",
    "MessageId",
    "MessageLimits",
    "NewMessage",
    "NewMessageBuilder",
    // the relay
    "DispatchReport",
    "Relay",
    "RelayConfig",
    "RelayHandle",
    "RetryPolicy",
    "Wakeup",
    // publishers
    "PublishOutcome",
    "Publisher",
    // the stores a service passes around, and how they are configured
    "ClaimMode",
    "KeyOrder",
    "OutboxStore",
    "Retention",
    // consumers, locks and their names
    "Consistency",
    "ConsumerName",
    "Dedup",
    "DedupStore",
    "DistributedLock",
    "EntityKey",
    "LockName",
    // operating it
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterOrder",
    "DeadLetterPage",
    "DeadLetterSelection",
    "OutboxAdmin",
    "OutboxStats",
    "PurgeRun",
    "Purger",
    "StatsReporter",
    // errors
    "Error",
    "ErrorKind",
    "ErrorStatus",
    "Report",
    "Result",
];

/// `outbox_core`'s public modules.
const CORE_MODULES: &[&str] = &[
    "admin",
    "backend",
    "consumer",
    "dedup",
    "error",
    "lock",
    "message",
    "monitor",
    "names",
    "otel",
    "publisher",
    "purge",
    "relay",
    "retry",
    "schema",
    "store",
];

/// The modules the facade re-exports: `outbox_core`'s but the backend kit, plus one per
/// backend, relay and publisher crate (behind its feature).
const FACADE_MODULES: &[&str] = &[
    "admin",
    "consumer",
    "dedup",
    "dynamodb",
    "dynamodb_streams",
    "error",
    "lock",
    "message",
    "monitor",
    "mysql",
    "names",
    "nats",
    "otel",
    "postgres",
    "postgres_wal",
    "publisher",
    "purge",
    "rabbitmq",
    "relay",
    "retry",
    "schema",
    "sqlite",
    "sqlserver",
    "sqs",
    "store",
    "testkit",
];

/// The code of a `lib.rs`: its lines without comments (`//`, `//!`, `///`).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The items of `pub use` statements at the top level of `text` (a crate root), as the
/// names they bring in: `a::{B, c::D as E}` gives `B` and `E`; `a::b as c` gives `c`.
fn pub_uses(text: &str) -> Vec<String> {
    let code = code(text);
    let mut names = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("\npub use ") {
        let stmt_start = at + "\npub use ".len();
        let end = rest[stmt_start..]
            .find(';')
            .expect("a `pub use` ends with `;`")
            + stmt_start;
        leaves(&rest[stmt_start..end], &mut names);
        rest = &rest[end..];
    }
    names
}

/// The names a use tree brings in.
fn leaves(tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let inner = &tree[open + 1..tree.rfind('}').expect("a closing brace")];
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    leaves(&inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        leaves(&inner[start..], out);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let name = match tree.split_once(" as ") {
        Some((_, alias)) => alias.trim(),
        None => tree.rsplit("::").next().expect("a path").trim(),
    };
    out.push(name.to_owned());
}

/// The `pub mod` names declared in a crate root.
fn pub_mods(text: &str) -> Vec<String> {
    code(text)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';').trim().to_owned())
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sorted(names: impl IntoIterator<Item = impl Into<String>>) -> BTreeSet<String> {
    names.into_iter().map(Into::into).collect()
}

/// What differs between a root as found and as listed, for the failure message.
fn difference(found: &BTreeSet<String>, listed: &BTreeSet<String>) -> String {
    let added: Vec<_> = found.difference(listed).collect();
    let dropped: Vec<_> = listed.difference(found).collect();
    format!("not in the list: {added:?}; listed but not found: {dropped:?}")
}

#[test]
fn the_core_root_exports_exactly_the_listed_names() {
    let lib = read(&root().join("outbox-core/src/lib.rs"));
    let found = sorted(pub_uses(&lib));
    let listed = sorted(ROOT_NAMES.iter().copied());
    assert_eq!(
        found,
        listed,
        "outbox_core's root changed ({}): a service-facing name goes in ROOT_NAMES, \
         anything for backend authors under outbox_core::backend, contract types under \
         outbox_core::store",
        difference(&found, &listed)
    );
    let mods = sorted(pub_mods(&lib));
    assert_eq!(
        mods,
        sorted(CORE_MODULES.iter().copied()),
        "outbox_core's public modules changed"
    );
}

#[test]
fn the_facade_exports_the_core_root_by_name_and_no_backend_kit() {
    let lib = read(&root().join("outbox/src/lib.rs"));
    let code = code(&lib);
    assert!(
        !code.contains("outbox_core::*"),
        "the facade re-exports by name, not with a glob"
    );
    let found = sorted(pub_uses(&lib));
    let modules = sorted(FACADE_MODULES.iter().copied());
    let names: BTreeSet<String> = found.difference(&modules).cloned().collect();
    let listed = sorted(ROOT_NAMES.iter().copied());
    assert_eq!(
        names,
        listed,
        "the facade's root names differ from outbox_core's ({})",
        difference(&names, &listed)
    );
    let mods: BTreeSet<String> = found.intersection(&modules).cloned().collect();
    assert_eq!(
        mods,
        modules,
        "the facade's modules changed ({})",
        difference(&mods, &modules)
    );
    assert!(
        !found.contains("backend"),
        "the backend kit is for crates that implement a backend, not the facade's users"
    );
}

#[test]
fn exported_macros_are_hidden_at_the_root_and_reexported_from_backend() {
    let mut files = Vec::new();
    rust_files(&root().join("outbox-core/src"), &mut files);
    let backend = read(&root().join("outbox-core/src/backend.rs"));
    let mut macros = Vec::new();
    for file in files {
        let text = read(&file);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != "#[macro_export]" {
                continue;
            }
            let name = lines[i + 1..]
                .iter()
                .find_map(|l| l.trim().strip_prefix("macro_rules! "))
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| {
                    panic!(
                        "{}:{}: a macro after #[macro_export]",
                        file.display(),
                        i + 1
                    )
                })
                .to_owned();
            let hidden = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    l.trim_start().starts_with("#[") || l.trim_start().starts_with("///")
                })
                .any(|l| l.trim() == "#[doc(hidden)]");
            assert!(
                hidden,
                "{}: macro {name} lands at outbox_core's root: mark it #[doc(hidden)] there",
                file.display()
            );
            macros.push(name);
        }
    }
    assert!(!macros.is_empty(), "the kit's macros were found");
    let reexported = sorted(pub_uses(&format!("\n{backend}")));
    for name in macros {
        assert!(
            reexported.contains(&name),
            "macro {name} is re-exported from outbox_core::backend"
        );
    }
}

#[test]
fn the_parser_reads_nested_and_renamed_uses() {
    let text =
        "\npub use a::{B, c::{D, E as F}};\n// pub use g::H;\npub use i::j as k;\npub mod m;\n";
    assert_eq!(pub_uses(text), ["B", "D", "F", "k"]);
    assert_eq!(pub_mods(text), ["m"]);
}
