//! The lists in the workspace's docs that name every backend, every relay and every
//! URL scheme of the `outbox` command, checked against the workspace itself, so the
//! next backend, relay or scheme cannot be left out of them silently.
//!
//! A checked list is the block of non-blank lines (a paragraph, a table, a bullet
//! list) that holds a marker, a line of its own with nothing but the comment:
//!
//! ```text
//! <!-- checked list: backend crates -->
//! ```
//!
//! What each kind of list must name:
//!
//! - `backend crates`: every backend crate, as `` `outbox-<engine>` ``;
//! - `backend engines`: every backend's engine name (`PostgreSQL`, `MySQL`, ...);
//! - `sqlx backend engines`: the engine name of every backend that depends on
//!   `outbox-sqlx`;
//! - `relay crates`: every relay crate, as `` `outbox-<name>` ``;
//! - `sql directories`: the `sql/` directory of every member that has one, as
//!   `` `outbox-<engine>/sql/ ``;
//! - `cli schemes`: every URL scheme `outbox-cli/src/target.rs` accepts, as
//!   `` `<scheme>:// ``.
//!
//! A **backend crate** implements `OutboxStore` for a storage engine and offers an
//! `enqueue` on that engine's own transaction. A **relay crate** moves messages to a
//! broker with a relay engine of its own, beside `outbox-core`'s polling relay (which
//! claims through `OutboxStore`). Which members are which is stated in [`MEMBERS`],
//! not guessed from names: every member of the root `Cargo.toml` outside `examples/`
//! must be listed there, so a new crate fails this test until someone decides what it
//! is. The schemes, the `sql/` directories and the sqlx dependency are read from the
//! files themselves.
//!
//! Members under `examples/` are programs to copy from, not crates of the library,
//! and are left out.
//!
//! [`REQUIRED`] says which lists each file must hold; a list found in a file but not
//! required there is checked all the same.
//!
//! Run: `cargo test -p outbox-core --test doc_lists`. It reads files only, so it lives
//! in the crate with the fewest dependencies.

mod workspace;

use std::collections::BTreeSet;
use workspace::{read, root};

/// What a workspace member is, for the lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A storage backend, with the engine name the docs use for it.
    Backend { engine: &'static str },
    /// A relay engine of its own.
    Relay,
    /// Anything else: the core, the facade, kits, publishers, tools, test crates.
    Other,
}

/// Every workspace member outside `examples/`, by package name.
const MEMBERS: &[(&str, Role)] = &[
    ("outbox", Role::Other),
    ("outbox-core", Role::Other),
    ("outbox-testkit", Role::Other),
    ("outbox-build", Role::Other),
    (
        "outbox-postgres",
        Role::Backend {
            engine: "PostgreSQL",
        },
    ),
    ("outbox-postgres-wal", Role::Relay),
    ("outbox-sqlite", Role::Backend { engine: "SQLite" }),
    ("outbox-sqlx", Role::Other),
    (
        "outbox-sqlserver",
        Role::Backend {
            engine: "SQL Server",
        },
    ),
    ("outbox-mysql", Role::Backend { engine: "MySQL" }),
    ("outbox-dynamodb", Role::Backend { engine: "DynamoDB" }),
    ("outbox-dynamodb-streams", Role::Relay),
    ("outbox-chaos", Role::Other),
    ("outbox-cli", Role::Other),
    ("outbox-nats", Role::Other),
    ("outbox-rabbitmq", Role::Other),
    ("outbox-sqs", Role::Other),
    ("outbox-e2e", Role::Other),
    ("outbox-bench", Role::Other),
];

/// The lists each file must hold, by kind (see the module docs).
const REQUIRED: &[(&str, &[&str])] = &[
    (
        "README.md",
        &[
            "backend crates",
            "backend engines",
            "relay crates",
            "cli schemes",
        ],
    ),
    (
        "docs/design.md",
        &["backend crates", "backend engines", "relay crates"],
    ),
    ("docs/operations.md", &["relay crates", "sql directories"]),
    (
        "CONTRIBUTING.md",
        &["backend crates", "sqlx backend engines"],
    ),
    ("outbox-cli/README.md", &["backend engines", "cli schemes"]),
    ("outbox-sqlx/README.md", &["sqlx backend engines"]),
];

const MARKER: &str = "<!-- checked list: ";

/// The `members` of the root `Cargo.toml`, as written (paths, globs included).
fn member_paths(manifest: &str) -> Vec<String> {
    let start = manifest
        .find("members = [")
        .expect("the root Cargo.toml has `members = [`");
    let rest = &manifest[start + "members = [".len()..];
    let end = rest.find(']').expect("`members` ends with `]`");
    rest[..end]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The package name in a member's `Cargo.toml`.
fn package_name(manifest: &str, path: &str) -> String {
    manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{path}/Cargo.toml names no package"))
        .to_owned()
}

/// The workspace's members outside `examples/`: package name and path.
fn members() -> Vec<(String, String)> {
    let root = root();
    member_paths(&read(&root.join("Cargo.toml")))
        .into_iter()
        .filter(|path| !path.starts_with("examples/"))
        .map(|path| {
            assert!(
                !path.contains('*'),
                "member `{path}`: this test expands only `examples/*`; list the crate itself"
            );
            let name = package_name(&read(&root.join(&path).join("Cargo.toml")), &path);
            (name, path)
        })
        .collect()
}

fn role(name: &str) -> Option<Role> {
    MEMBERS.iter().find(|(n, _)| *n == name).map(|&(_, r)| r)
}

/// The URL schemes the CLI accepts: the string patterns of the `match` on the scheme
/// in `outbox-cli/src/target.rs`.
fn cli_schemes() -> Vec<String> {
    let path = root().join("outbox-cli/src/target.rs");
    let text = read(&path);
    let start = text
        .find("match scheme.to_ascii_lowercase()")
        .expect("outbox-cli/src/target.rs matches on `scheme.to_ascii_lowercase()`");
    let mut schemes = Vec::new();
    for line in text[start..].lines().skip(1) {
        let line = line.trim();
        if line.starts_with("other =>") || line.starts_with("_ =>") {
            break;
        }
        if let Some((patterns, _)) = line.split_once("=>").filter(|_| line.starts_with('"')) {
            schemes.extend(
                patterns
                    .split('|')
                    .map(|p| p.trim().trim_matches('"').to_owned()),
            );
        }
    }
    assert!(
        !schemes.is_empty(),
        "no scheme found in the match of outbox-cli/src/target.rs: did its shape change?"
    );
    schemes
}

/// What a list of this kind must name, each as the text to find and as it is reported.
fn expected(kind: &str, members: &[(String, String)]) -> Option<Vec<(String, String)>> {
    let root = root();
    let backends = || {
        members
            .iter()
            .filter_map(|(name, path)| match role(name) {
                Some(Role::Backend { engine }) => Some((name.clone(), path.clone(), engine)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let crate_item = |name: &str| (format!("`{name}`"), format!("`{name}`"));
    let items: Vec<(String, String)> = match kind {
        "backend crates" => backends().iter().map(|(n, _, _)| crate_item(n)).collect(),
        "backend engines" => backends()
            .iter()
            .map(|(n, _, engine)| (engine.to_string(), format!("{engine} ({n})")))
            .collect(),
        "sqlx backend engines" => backends()
            .iter()
            .filter(|(_, path, _)| {
                read(&root.join(path).join("Cargo.toml"))
                    .lines()
                    .any(|l| l.trim_start().starts_with("outbox-sqlx"))
            })
            .map(|(n, _, engine)| (engine.to_string(), format!("{engine} ({n})")))
            .collect(),
        "relay crates" => members
            .iter()
            .filter(|(name, _)| role(name) == Some(Role::Relay))
            .map(|(n, _)| crate_item(n))
            .collect(),
        "sql directories" => members
            .iter()
            .filter(|(_, path)| root.join(path).join("sql").is_dir())
            .map(|(_, path)| (format!("`{path}/sql/"), format!("`{path}/sql/`")))
            .collect(),
        "cli schemes" => cli_schemes()
            .into_iter()
            .map(|s| (format!("`{s}://"), format!("`{s}://`")))
            .collect(),
        _ => return None,
    };
    Some(items)
}

/// The checked lists of one file: kind, first line (1-based) and text of each.
fn lists(text: &str) -> Vec<(String, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(kind) = line
            .trim()
            .strip_prefix(MARKER)
            .and_then(|rest| rest.strip_suffix("-->"))
        else {
            continue;
        };
        let kind = kind.trim().to_owned();
        let blank = |l: &&str| l.trim().is_empty();
        let first = lines[..i].iter().rposition(blank).map_or(0, |b| b + 1);
        let last = lines[i..]
            .iter()
            .position(blank)
            .map_or(lines.len(), |b| i + b);
        found.push((kind, first + 1, lines[first..last].join("\n")));
    }
    found
}

#[test]
fn every_workspace_member_is_classified() {
    let members = members();
    let mut problems = Vec::new();
    for (name, path) in &members {
        if role(name).is_none() {
            problems.push(format!(
                "workspace member `{name}` ({path}) is not classified: add it to MEMBERS in \
                 outbox-core/tests/doc_lists.rs as a backend, a relay or other"
            ));
        }
    }
    for (name, _) in MEMBERS {
        if !members.iter().any(|(n, _)| n == name) {
            problems.push(format!(
                "MEMBERS in outbox-core/tests/doc_lists.rs names `{name}`, which is not a \
                 workspace member: remove it"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn doc_lists_name_every_backend_relay_and_cli_scheme() {
    let members = members();
    let root = root();
    let mut problems = Vec::new();
    for (file, required) in REQUIRED {
        let found = lists(&read(&root.join(file)));
        for kind in *required {
            if !found.iter().any(|(k, _, _)| k == kind) {
                problems.push(format!(
                    "{file}: no list of {kind} (a block marked `<!-- checked list: {kind} -->`)"
                ));
            }
        }
        for (kind, line, text) in &found {
            let Some(items) = expected(kind, &members) else {
                problems.push(format!(
                    "{file}:{line}: unknown kind of checked list `{kind}`"
                ));
                continue;
            };
            let missing: BTreeSet<&str> = items
                .iter()
                .filter(|(needle, _)| !text.contains(needle.as_str()))
                .map(|(_, shown)| shown.as_str())
                .collect();
            for item in missing {
                problems.push(format!("{file}:{line}: the list of {kind} misses {item}"));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}
