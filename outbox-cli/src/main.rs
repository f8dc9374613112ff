#![doc = include_str!("../README.md")]

mod backend;
mod cli;
mod commands;
mod dynamo;
mod fail;
mod mssql;
mod output;
mod target;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::fail::Exit;
use crate::output::Term;
use crate::target::Secrets;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    let secrets = Secrets::of_url(cli.global.url.as_deref().unwrap_or_default());
    let term = Term::new(secrets, cli.global.json);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            term.failure(&fail::Failure::error(format!("cannot start: {e}")));
            return Exit::Error.into();
        }
    };
    match runtime.block_on(commands::run(&cli, &term)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            term.failure(&failure);
            failure.exit.into()
        }
    }
}

/// Print clap's help, version or usage error (redacted: an argument it echoes may
/// hold the URL) and exit with its code: 0 for help and version, 2 for usage.
fn clap_exit(e: &clap::Error) -> ExitCode {
    let mut secrets = Secrets::default();
    for arg in std::env::args().chain(std::env::var("OUTBOX_URL")) {
        secrets.extend(Secrets::of_url(&arg));
    }
    let text = secrets.redact(&e.render().to_string());
    if e.use_stderr() {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    match e.exit_code() {
        0 => ExitCode::SUCCESS,
        _ => Exit::Usage.into(),
    }
}
