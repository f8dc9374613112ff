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
    println!("cargo::rerun-if-env-changed={var}");
    let url = std::env::var(var).ok();
    apply(url_outcome(
        var,
        service,
        require,
        url.as_deref(),
        read_require_integration(require).as_deref(),
    ));
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
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed={DEBIAN_POSTGRESQL}");
    let bindir = postgres_bindir();
    apply(server_outcome(
        bindir.as_deref(),
        require,
        read_require_integration(require).as_deref(),
    ));
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

/// Reads `OUTBOX_REQUIRE_INTEGRATION` (and asks cargo to watch it) when `require` can
/// make it matter.
fn read_require_integration(require: Require) -> Option<String> {
    match require {
        Require::InCi => {
            println!("cargo::rerun-if-env-changed={REQUIRE_INTEGRATION}");
            std::env::var(REQUIRE_INTEGRATION).ok()
        }
        Require::Never => None,
    }
}

/// Prints `outcome`'s build-script instructions, or panics with its message.
fn apply(outcome: Outcome) {
    println!("cargo::rustc-check-cfg=cfg({SERVICE_UNSET_CFG})");
    match outcome {
        Outcome::Available => {}
        Outcome::Ignore(warning) => {
            println!("cargo::warning={warning}");
            println!("cargo::rustc-cfg={SERVICE_UNSET_CFG}");
        }
        Outcome::Fail(message) => panic!("{message}"),
    }
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
