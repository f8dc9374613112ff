//! The command line and environment every bench reads the same way.

/// Whether the bench runs in its quick mode: `-- --quick` on the command line or
/// `OUTBOX_BENCH_QUICK=1` in the environment (either works for every bench).
pub fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
        || std::env::var("OUTBOX_BENCH_QUICK").is_ok_and(|v| v.trim() == "1")
}

/// Whether the scenario `name` runs: `OUTBOX_BENCH_ONLY` unset or empty runs every
/// scenario, else only those it names, comma-separated.
pub fn selected(name: &str) -> bool {
    let only = std::env::var("OUTBOX_BENCH_ONLY").unwrap_or_default();
    only.trim().is_empty() || only.split(',').any(|n| n.trim() == name)
}

/// Whether `cargo bench` started the bench: it passes `--bench`, which `cargo test
/// --benches` does not (a bench that takes minutes skips itself there).
pub fn started_by_cargo_bench() -> bool {
    std::env::args().skip(1).any(|a| a == "--bench")
}
