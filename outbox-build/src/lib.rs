#![doc = include_str!("../README.md")]
// The README's example is a whole `build.rs`, so its `fn main` is the point.
#![allow(clippy::needless_doctest_main)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cfg a gate sets when its service is missing.
pub const SERVICE_UNSET_CFG: &str = "outbox_service_unset";

/// The environment variable that turns a missing service into a failed build when it
/// is `1`.
pub const REQUIRE_INTEGRATION: &str = "OUTBOX_REQUIRE_INTEGRATION";

/// Where the versioned PostgreSQL installs live on Debian and Ubuntu.
const DEBIAN_POSTGRESQL: &str = "/usr/lib/postgresql";

/// Whether a missing service fails the build under `OUTBOX_REQUIRE_INTEGRATION=1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Require {
    /// CI runs the service (`scripts/services.sh` starts it), so under
    /// `OUTBOX_REQUIRE_INTEGRATION=1` a missing service fails the build.
    InCi,
    /// CI does not run the service (SQL Server), so a missing service only ever builds
    /// its tests as ignored.
    Never,
}

/// Gates a crate's service tests on the URL variable `var`; `service` names what those
/// tests need in the messages (`"PostgreSQL"`, `"an SQS endpoint"`).
///
/// When `var` is set and not blank, does nothing more. Otherwise prints a cargo
/// warning and sets the cfg `outbox_service_unset`, or, under
/// `OUTBOX_REQUIRE_INTEGRATION=1` with [`Require::InCi`], panics, which fails the
/// build. Asks cargo to rerun the script when the variables it reads change. Call it
/// from a build script only: it prints cargo's build-script instructions.
pub fn gate_on_url(var: &str, service: &str, require: Require) {
    emit(url_gate(var, service, require, &env_var));
}

/// Gates a crate's tests that start a private PostgreSQL cluster on the server
/// binaries (`initdb`, `pg_ctl`), searched for as [`postgres_bindir`] does.
///
/// When they are found, does nothing more. Otherwise prints a cargo warning and sets
/// the cfg `outbox_service_unset`, or, under `OUTBOX_REQUIRE_INTEGRATION=1` with
/// [`Require::InCi`], panics, which fails the build. Asks cargo to rerun the script
/// when `PATH` (where `pg_config` is found) or `/usr/lib/postgresql` changes. Call it
/// from a build script only: it prints cargo's build-script instructions.
pub fn gate_on_postgres_server(require: Require) {
    emit(server_gate(postgres_bindir().as_deref(), require, &env_var));
}

/// The directory holding the PostgreSQL server binaries `initdb` and `pg_ctl`:
/// `pg_config --bindir` when it holds both, else the newest
/// `/usr/lib/postgresql/<version>/bin` that does, else `None`.
///
/// Runs `pg_config` from `PATH`; usable outside build scripts (it prints nothing).
pub fn postgres_bindir() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    bindir_in(from_pg_config, Path::new(DEBIAN_POSTGRESQL))
}

/// What a gate decided.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The service is there: the tests are built to run.
    Available,
    /// The service is missing: warn with this text and set the cfg.
    Ignore(String),
    /// The service is missing but required: fail the build with this message.
    Fail(String),
}

/// A gate's work: the build-script instructions to print, or (`Err`) the message to
/// fail the build with.
type Gate = std::result::Result<Vec<String>, String>;

/// Reads an environment variable, `None` when it is unset or not Unicode.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Prints a gate's instructions, or panics with its message (which fails the build).
fn emit(gate: Gate) {
    match gate {
        Ok(lines) => lines.iter().for_each(|line| println!("{line}")),
        Err(message) => panic!("{message}"),
    }
}

/// [`gate_on_url`]'s work, reading the environment through `env`.
fn url_gate(
    var: &str,
    service: &str,
    require: Require,
    env: &dyn Fn(&str) -> Option<String>,
) -> Gate {
    let mut lines = vec![format!("cargo::rerun-if-env-changed={var}")];
    let required = read_require_integration(require, env, &mut lines);
    let url = env(var);
    finish(
        lines,
        url_outcome(var, service, require, url.as_deref(), required.as_deref()),
    )
}

/// [`gate_on_postgres_server`]'s work, given the directory found and reading the
/// environment through `env`.
fn server_gate(
    bindir: Option<&Path>,
    require: Require,
    env: &dyn Fn(&str) -> Option<String>,
) -> Gate {
    let mut lines = vec![
        "cargo::rerun-if-env-changed=PATH".to_owned(),
        format!("cargo::rerun-if-changed={DEBIAN_POSTGRESQL}"),
    ];
    let required = read_require_integration(require, env, &mut lines);
    finish(lines, server_outcome(bindir, require, required.as_deref()))
}

/// Reads `OUTBOX_REQUIRE_INTEGRATION` through `env` (and asks cargo to watch it) when
/// `require` can make it matter.
fn read_require_integration(
    require: Require,
    env: &dyn Fn(&str) -> Option<String>,
    lines: &mut Vec<String>,
) -> Option<String> {
    match require {
        Require::InCi => {
            lines.push(format!("cargo::rerun-if-env-changed={REQUIRE_INTEGRATION}"));
            env(REQUIRE_INTEGRATION)
        }
        Require::Never => None,
    }
}

/// `lines` followed by `outcome`'s instructions: the cfg declared, and when the service
/// is missing a warning and the cfg set; or `outcome`'s failure.
fn finish(mut lines: Vec<String>, outcome: Outcome) -> Gate {
    lines.push(format!("cargo::rustc-check-cfg=cfg({SERVICE_UNSET_CFG})"));
    match outcome {
        Outcome::Available => {}
        Outcome::Ignore(warning) => {
            lines.push(format!("cargo::warning={warning}"));
            lines.push(format!("cargo::rustc-cfg={SERVICE_UNSET_CFG}"));
        }
        Outcome::Fail(message) => return Err(message),
    }
    Ok(lines)
}

/// [`gate_on_url`]'s decision, given the values of `var` and of
/// `OUTBOX_REQUIRE_INTEGRATION` (`None` when unset).
fn url_outcome(
    var: &str,
    service: &str,
    require: Require,
    url: Option<&str>,
    require_integration: Option<&str>,
) -> Outcome {
    if url.is_some_and(|u| !u.trim().is_empty()) {
        return Outcome::Available;
    }
    let missing = format!("{var} is not set");
    let fix = match require {
        Require::InCi => {
            format!("; `eval \"$(scripts/services.sh)\"` starts {service} and sets it")
        }
        Require::Never => String::new(),
    };
    decide(
        require,
        require_integration,
        format!(
            "{missing}: this crate's tests built with `cfg_attr({SERVICE_UNSET_CFG}, ignore)`, \
             the testkit suites' cases among them, are ignored (they need {service}){fix}"
        ),
        format!(
            "{missing} but {REQUIRE_INTEGRATION}=1 requires the tests that need {service} to \
             run: start the services and export their URLs with \
             `eval \"$(scripts/services.sh)\"`"
        ),
    )
}

/// [`gate_on_postgres_server`]'s decision, given the directory found (`None` when
/// none) and the value of `OUTBOX_REQUIRE_INTEGRATION` (`None` when unset).
fn server_outcome(
    bindir: Option<&Path>,
    require: Require,
    require_integration: Option<&str>,
) -> Outcome {
    if bindir.is_some() {
        return Outcome::Available;
    }
    let missing = format!(
        "no PostgreSQL server binaries (initdb, pg_ctl) in `pg_config --bindir` or \
         {DEBIAN_POSTGRESQL}/<version>/bin"
    );
    decide(
        require,
        require_integration,
        format!(
            "{missing}: this crate's tests built with `cfg_attr({SERVICE_UNSET_CFG}, ignore)` \
             are ignored (they start a private PostgreSQL cluster)"
        ),
        format!(
            "{missing} but {REQUIRE_INTEGRATION}=1 requires the tests that start a private \
             PostgreSQL cluster to run: install the PostgreSQL server package \
             (`scripts/services.sh` does)"
        ),
    )
}

/// A missing service's outcome: `fail` when `require` lets
/// `OUTBOX_REQUIRE_INTEGRATION` (`require_integration`) demand it, else `ignore`.
fn decide(
    require: Require,
    require_integration: Option<&str>,
    ignore: String,
    fail: String,
) -> Outcome {
    let required = require_integration.is_some_and(|v| v.trim() == "1");
    match require {
        Require::InCi if required => Outcome::Fail(fail),
        Require::InCi | Require::Never => Outcome::Ignore(ignore),
    }
}

/// [`postgres_bindir`]'s search, given `pg_config --bindir` (`None` when it failed)
/// and the directory of versioned installs.
fn bindir_in(from_pg_config: Option<PathBuf>, versions: &Path) -> Option<PathBuf> {
    if let Some(dir) = from_pg_config.filter(|d| has_server(d)) {
        return Some(dir);
    }
    std::fs::read_dir(versions)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| Some((version_key(e.file_name().to_str()?)?, e.path().join("bin"))))
        .filter(|(_, bin)| has_server(bin))
        .max()
        .map(|(_, bin)| bin)
}

/// Whether `dir` holds both `initdb` and `pg_ctl`.
fn has_server(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// A version directory's name as numbers to order by (`"16"`, `"9.6"`), or `None`
/// when it is not a version.
fn version_key(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: Option<&str>, require_integration: Option<&str>) -> Outcome {
        url_outcome(
            "OUTBOX_PG_URL",
            "PostgreSQL",
            Require::InCi,
            url,
            require_integration,
        )
    }

    fn mssql(url: Option<&str>, require_integration: Option<&str>) -> Outcome {
        url_outcome(
            "OUTBOX_TEST_MSSQL_URL",
            "SQL Server",
            Require::Never,
            url,
            require_integration,
        )
    }

    fn warning(outcome: Outcome) -> String {
        match outcome {
            Outcome::Ignore(w) => w,
            other => panic!("expected a warning, got {other:?}"),
        }
    }

    fn failure(outcome: Outcome) -> String {
        match outcome {
            Outcome::Fail(m) => m,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_set_url_is_available_whatever_integration_requires() {
        for required in [None, Some("1"), Some("0")] {
            assert_eq!(pg(Some("postgres://x"), required), Outcome::Available);
            assert_eq!(mssql(Some("mssql://x"), required), Outcome::Available);
        }
    }

    #[test]
    fn an_unset_or_blank_url_ignores_the_tests_with_a_warning() {
        for url in [None, Some(""), Some("  \n")] {
            for required in [None, Some(""), Some("0"), Some("true"), Some("11")] {
                let w = warning(pg(url, required));
                assert!(w.starts_with("OUTBOX_PG_URL is not set: "), "{w}");
                assert!(
                    w.contains("`cfg_attr(outbox_service_unset, ignore)`"),
                    "{w}"
                );
                assert!(w.contains("PostgreSQL"), "{w}");
                assert!(w.contains("scripts/services.sh"), "{w}");
            }
        }
    }

    #[test]
    fn integration_required_fails_on_an_unset_url() {
        for required in ["1", " 1\n"] {
            let m = failure(pg(None, Some(required)));
            assert!(
                m.starts_with("OUTBOX_PG_URL is not set but OUTBOX_REQUIRE_INTEGRATION=1"),
                "{m}"
            );
            assert!(m.contains("scripts/services.sh"), "{m}");
            assert!(m.contains("the tests that need PostgreSQL"), "{m}");
            failure(pg(Some(" "), Some(required)));
        }
    }

    #[test]
    fn a_service_ci_does_not_run_is_never_required() {
        let w = warning(mssql(None, Some("1")));
        assert!(w.starts_with("OUTBOX_TEST_MSSQL_URL is not set: "), "{w}");
        assert!(w.contains("SQL Server"), "{w}");
        assert!(!w.contains("scripts/services.sh"), "{w}");
    }

    #[test]
    fn server_binaries_decide_like_a_url() {
        let dir = Path::new("/usr/lib/postgresql/16/bin");
        assert_eq!(
            server_outcome(Some(dir), Require::InCi, Some("1")),
            Outcome::Available
        );
        let w = warning(server_outcome(None, Require::InCi, None));
        assert!(
            w.starts_with("no PostgreSQL server binaries (initdb, pg_ctl)"),
            "{w}"
        );
        assert!(
            w.contains("`cfg_attr(outbox_service_unset, ignore)`"),
            "{w}"
        );
        let m = failure(server_outcome(None, Require::InCi, Some("1")));
        assert!(m.contains("OUTBOX_REQUIRE_INTEGRATION=1"), "{m}");
        assert!(m.contains("install the PostgreSQL server package"), "{m}");
        warning(server_outcome(None, Require::Never, Some("1")));
    }

    /// An environment holding only `vars`.
    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_url_gate_watches_what_it_read_and_sets_the_cfg_only_when_the_url_is_missing() {
        let watch = [
            "cargo::rerun-if-env-changed=OUTBOX_PG_URL",
            "cargo::rerun-if-env-changed=OUTBOX_REQUIRE_INTEGRATION",
            "cargo::rustc-check-cfg=cfg(outbox_service_unset)",
        ];
        let set = env_of(&[
            ("OUTBOX_PG_URL", "postgres://x"),
            ("OUTBOX_REQUIRE_INTEGRATION", "1"),
        ]);
        let lines = url_gate("OUTBOX_PG_URL", "PostgreSQL", Require::InCi, &set).unwrap();
        assert_eq!(lines, watch);
        let unset = env_of(&[]);
        let lines = url_gate("OUTBOX_PG_URL", "PostgreSQL", Require::InCi, &unset).unwrap();
        assert_eq!(lines[..3], watch);
        assert!(
            lines[3].starts_with("cargo::warning=OUTBOX_PG_URL is not set: "),
            "{lines:?}"
        );
        assert_eq!(lines[4], "cargo::rustc-cfg=outbox_service_unset");
        assert_eq!(lines.len(), 5);
        let required = env_of(&[("OUTBOX_REQUIRE_INTEGRATION", "1")]);
        let message = url_gate("OUTBOX_PG_URL", "PostgreSQL", Require::InCi, &required)
            .expect_err("required and missing fails the build");
        assert!(
            message.contains("OUTBOX_REQUIRE_INTEGRATION=1"),
            "{message}"
        );
        // A service CI does not run neither reads nor watches the requirement.
        let lines = url_gate(
            "OUTBOX_TEST_MSSQL_URL",
            "SQL Server",
            Require::Never,
            &required,
        )
        .unwrap();
        assert_eq!(
            lines[0],
            "cargo::rerun-if-env-changed=OUTBOX_TEST_MSSQL_URL"
        );
        assert_eq!(lines[1], "cargo::rustc-check-cfg=cfg(outbox_service_unset)");
        assert_eq!(
            lines.last().unwrap(),
            "cargo::rustc-cfg=outbox_service_unset"
        );
    }

    #[test]
    fn a_server_gate_watches_the_search_and_sets_the_cfg_only_when_nothing_was_found() {
        let required = env_of(&[("OUTBOX_REQUIRE_INTEGRATION", "1")]);
        let dir = Path::new("/usr/lib/postgresql/16/bin");
        let lines = server_gate(Some(dir), Require::InCi, &required).unwrap();
        assert_eq!(
            lines,
            [
                "cargo::rerun-if-env-changed=PATH",
                "cargo::rerun-if-changed=/usr/lib/postgresql",
                "cargo::rerun-if-env-changed=OUTBOX_REQUIRE_INTEGRATION",
                "cargo::rustc-check-cfg=cfg(outbox_service_unset)",
            ]
        );
        let message = server_gate(None, Require::InCi, &required).expect_err("required");
        assert!(
            message.contains("install the PostgreSQL server package"),
            "{message}"
        );
        let lines = server_gate(None, Require::InCi, &env_of(&[])).unwrap();
        assert_eq!(
            lines.last().unwrap(),
            "cargo::rustc-cfg=outbox_service_unset"
        );
    }

    #[test]
    fn env_var_reads_the_process_environment() {
        // Cargo sets it for every test it runs.
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo");
        assert_eq!(env_var("CARGO_MANIFEST_DIR"), Some(dir));
        assert_eq!(env_var("OUTBOX_BUILD_TEST_NEVER_SET"), None);
    }

    #[test]
    #[should_panic(expected = "fails the build")]
    fn emit_fails_the_build_with_the_gates_message() {
        emit(Err("this message fails the build".to_owned()));
    }

    /// The search on this machine: what it finds holds a server, and under
    /// `OUTBOX_REQUIRE_INTEGRATION=1` (CI, whose `scripts/services.sh` installs
    /// PostgreSQL) it finds one.
    #[test]
    fn postgres_bindir_finds_a_whole_server_where_one_is_installed() {
        let found = postgres_bindir();
        if let Some(dir) = &found {
            assert!(has_server(dir), "{}", dir.display());
        }
        if std::env::var(REQUIRE_INTEGRATION).as_deref() == Ok("1") {
            assert!(found.is_some(), "no PostgreSQL server binaries found");
        }
    }

    #[test]
    fn versions_order_by_number() {
        assert_eq!(version_key("16"), Some(vec![16]));
        assert_eq!(version_key("9.6"), Some(vec![9, 6]));
        assert_eq!(version_key("main"), None);
        assert_eq!(version_key(""), None);
        assert!(version_key("9.6") < version_key("10"));
    }

    /// A scratch directory under the system temp directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("outbox-build-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create the scratch directory");
            Scratch(dir)
        }

        /// Makes `<rel>/initdb` and, when `complete`, `<rel>/pg_ctl`; returns the directory.
        fn server(&self, rel: &str, complete: bool) -> PathBuf {
            let dir = self.0.join(rel);
            std::fs::create_dir_all(&dir).expect("create a bin directory");
            std::fs::write(dir.join("initdb"), "").expect("write initdb");
            if complete {
                std::fs::write(dir.join("pg_ctl"), "").expect("write pg_ctl");
            }
            dir
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_search_prefers_pg_config_then_the_newest_complete_version() {
        let s = Scratch::new("search");
        let versions = s.0.join("versions");
        assert_eq!(bindir_in(None, &versions), None, "no versions directory");
        s.server("versions/9.6/bin", true);
        let v15 = s.server("versions/15/bin", true);
        s.server("versions/17/bin", false);
        s.server("versions/main/bin", true);
        assert_eq!(bindir_in(None, &versions), Some(v15.clone()));
        let configured = s.server("configured", true);
        assert_eq!(
            bindir_in(Some(configured.clone()), &versions),
            Some(configured)
        );
        let incomplete = s.server("incomplete", false);
        assert_eq!(bindir_in(Some(incomplete), &versions), Some(v15));
    }
}
