//! Why a command failed, what to do about it, and the exit code that says so.

use std::process::ExitCode;

use outbox_core::{Error, ErrorKind};

/// The exit codes scripts can rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 1: the command ran and failed, or was declined.
    Error,
    /// 2: the command line is wrong (as clap reports its own errors).
    Usage,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        match exit {
            Exit::Error => ExitCode::from(1),
            Exit::Usage => ExitCode::from(2),
        }
    }
}

/// A failed command: printed as `error: <message>` and `hint: <hint>` on stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
}

impl Failure {
    /// A failure of the command (exit 1).
    pub(crate) fn error(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Error,
            message: message.into(),
            hint: None,
        }
    }

    /// A wrong command line (exit 2).
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Usage,
            message: message.into(),
            hint: None,
        }
    }

    /// What to do next.
    #[must_use]
    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// A library error met while doing `what` on `place` (a table or database, as
    /// printed), with the hint its kind calls for.
    pub(crate) fn from_library(what: &str, place: &str, err: &Error) -> Failure {
        let message = format!("{what} on {place}: {}", err.report());
        match err.kind() {
            ErrorKind::Schema => Failure::error(message).hint(
                "is the outbox installed there? Check --url, --schema and --table; \
                 `outbox schema install` creates the tables (or apply `outbox schema print` \
                 with your migration tool)",
            ),
            ErrorKind::Unavailable | ErrorKind::Timeout => Failure::error(message)
                .hint("check that the database is running and reachable at --url, then retry"),
            ErrorKind::Contention => {
                Failure::error(message).hint("the database is busy; retry in a moment")
            }
            ErrorKind::Config | ErrorKind::InvalidInput => Failure::usage(message),
            _ => Failure::error(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_exit_codes_and_hints() {
        let place = "\"outbox\".\"outbox_messages\"";
        let missing = Failure::from_library(
            "stats",
            place,
            &Error::new(ErrorKind::Schema, "stats failed"),
        );
        assert_eq!(missing.exit, Exit::Error);
        assert!(missing.hint.unwrap().contains("outbox schema install"));
        let down = Error::new(ErrorKind::Unavailable, "connect failed");
        let down = Failure::from_library("connect", place, &down);
        assert!(down.hint.unwrap().contains("running"));
        let bad = Failure::from_library("open", place, &Error::config("bad table name"));
        assert_eq!(bad.exit, Exit::Usage);
        assert_eq!(ExitCode::from(Exit::Usage), ExitCode::from(2));
    }
}
