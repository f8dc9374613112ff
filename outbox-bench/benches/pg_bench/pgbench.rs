//! The ceiling: the library's own claim and complete statements, driven by `pgbench`.
//!
//! The statements are not copied from the source (the crate exposes no SQL): [`capture`]
//! runs one real claim and complete through [`PgOutbox`] on a single relay connection
//! and reads their text and parameter types back from its `pg_prepared_statements`. So
//! the ceiling runs exactly what the library sends. pgbench runs both prepared
//! (`-M prepared`) on ordinary sessions; the drain scenario analyzes the table before
//! each run, so their cached plans fit it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use outbox_core::{store::ClaimRequest, store::Lease, OutboxStore};
use outbox_postgres::{PgOutbox, PgOutboxConfig};

use crate::harness::{preload, Env, Res};

/// The statements a claim + complete round sends, as the server saw them.
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    /// Claim text: `$1` limit, `$2` lease in µs, `$3` lease token.
    pub(crate) claim: String,
    pub(crate) claim_types: Vec<String>,
    /// Complete text: `$1` ids, `$2` tokens.
    pub(crate) complete: String,
    pub(crate) complete_types: Vec<String>,
}

/// A row of `pg_prepared_statements`: statement text and parameter types.
type Prepared = (String, Vec<String>);

/// What `pgbench` reported for one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PgbenchRun {
    /// Script executions (claim + complete rounds) per second, without connection time.
    pub(crate) tps: f64,
}

/// Enqueue one message into `config`'s (installed) table, claim and complete it through
/// the library on one connection, and read back the statements it prepared.
pub(crate) async fn capture(env: &Env, config: PgOutboxConfig) -> Res<Captured> {
    let pool = env.pool(1).await?;
    let outbox = PgOutbox::new(pool.clone(), config.with_relay_connections(1))?;
    preload(&outbox, 1).await?;
    let claimed = outbox
        .claim(ClaimRequest::new(1, Duration::from_secs(30))?)
        .await?;
    let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
    let settled = outbox.complete(&leases).await?;
    if claimed.len() != 1 || settled.applied != 1 {
        return Err(
            "capturing the library's SQL: the probe message was not claimed and completed".into(),
        );
    }
    // Both ran, prepared, on the relay's one connection.
    let prepared: Vec<Prepared> =
        sqlx::query_as("SELECT statement, parameter_types::text[] FROM pg_prepared_statements")
            .fetch_all(outbox.relay_pool())
            .await?;
    outbox.relay_pool().close().await;
    pool.close().await;
    let find =
        |what: &str, pick: &dyn Fn(&Prepared) -> bool| {
            prepared.iter().find(|s| pick(s)).cloned().ok_or_else(|| {
                format!("no {what} statement among the library's prepared statements")
            })
        };
    let (claim, claim_types) = find("claim", &|(sql, _)| sql.contains("SKIP LOCKED"))?;
    let (complete, _) = find("complete", &|(sql, _)| {
        sql.contains("unnest($1::uuid[], $2::uuid[]) AS l(id, token)")
    })?;
    let complete_types = vec!["uuid[]".to_owned(); 2];
    if claim_types != ["bigint", "bigint", "uuid"] {
        return Err(format!(
            "the library's claim now takes {claim_types:?}, not (limit bigint, lease_us bigint, \
             token uuid): update benches/pg_bench/pgbench.rs"
        )
        .into());
    }
    Ok(Captured {
        claim,
        claim_types,
        complete,
        complete_types,
    })
}

/// Replace each `$n` in `sql` with `replace(n, cast)` (1-based), where `cast` says
/// whether the statement already casts the parameter (`$n::type`).
pub(crate) fn substitute(sql: &str, replace: impl Fn(usize, bool) -> Res<String>) -> Res<String> {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let len = after.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return Err(format!("unexpected '$' in statement: {sql}").into());
        }
        rest = &after[len..];
        out.push_str(&replace(after[..len].parse()?, rest.starts_with("::"))?);
    }
    out.push_str(rest);
    Ok(out)
}

/// `$n` becomes the pgbench variable `names[n-1]`, cast to the type the library binds
/// unless the statement casts it already.
fn with_variables(sql: &str, names: &[&str], types: &[String]) -> Res<String> {
    substitute(sql, |n, cast| {
        let name = names.get(n - 1).ok_or("more parameters than variables")?;
        let ty = types.get(n - 1).ok_or("more parameters than types")?;
        Ok(if cast {
            format!(":{name}")
        } else {
            format!("(:{name})::{ty}")
        })
    })
}

/// The pgbench script: one claim + complete round per transaction.
///
/// pgbench cannot loop over a result set, so the claim statement is wrapped in a CTE
/// that folds the claimed ids into one array row for `\gset`: the server does the
/// same claim work, but the claimed rows are not shipped to the client as they are to
/// the library. Complete is the library's statement verbatim.
pub(crate) fn script(captured: &Captured) -> Res<String> {
    let claim = with_variables(
        &captured.claim,
        &["limit", "lease_us", "token"],
        &captured.claim_types,
    )?;
    let complete = with_variables(
        &captured.complete,
        &["ids", "tokens"],
        &captured.complete_types,
    )?;
    Ok(format!(
        "-- Generated by outbox-bench/benches/pg_bench.rs from the statements PgOutbox \
         prepared (pg_prepared_statements).\n\
         -- Variables: limit (batch), lease_us, token (set with -D).\n\
         WITH claimed AS ({claim}) SELECT coalesce(array_agg(id), '{{}}') AS ids, \
         coalesce(array_agg((:token)::uuid), '{{}}') AS tokens FROM claimed \\gset\n\
         {complete};\n"
    ))
}

/// Write `text` to `dir/name` and return the path.
pub(crate) fn write_script(dir: &Path, name: &str, text: &str) -> Res<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Whether a `pgbench` binary is on the PATH.
pub(crate) fn available() -> bool {
    Command::new("pgbench")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Run `script` with `clients` clients for `length` (`-T`, whole seconds, at least 1).
pub(crate) async fn run_for(
    env: &Env,
    script: &Path,
    clients: u32,
    length: Duration,
) -> Res<PgbenchRun> {
    let seconds = length.as_secs().max(1);
    run_args(
        env,
        script,
        clients,
        &["-T".to_owned(), seconds.to_string()],
        &[],
    )
    .await
}

/// Run `script` with `clients` clients, `per_client` transactions each.
pub(crate) async fn run(
    env: &Env,
    script: &Path,
    clients: u32,
    per_client: u64,
    batch: usize,
) -> Res<PgbenchRun> {
    let variables = [
        format!("limit={batch}"),
        "lease_us=30000000".to_owned(),
        format!("token={}", uuid::Uuid::new_v4()),
    ];
    run_args(
        env,
        script,
        clients,
        &["-t".to_owned(), per_client.to_string()],
        &variables,
    )
    .await
}

/// Run `script` with `clients` clients, the length arguments given (`-t n` or `-T s`)
/// and `-D` for each of `variables`.
async fn run_args(
    env: &Env,
    script: &Path,
    clients: u32,
    length: &[String],
    variables: &[String],
) -> Res<PgbenchRun> {
    let threads = clients.min(u32::try_from(env.nproc)?).max(1);
    let mut command = Command::new("pgbench");
    command
        .args(["-n", "-M", "prepared", "-f"])
        .arg(script)
        .args(["-c", &clients.to_string(), "-j", &threads.to_string()])
        .args(length);
    for variable in variables {
        command.args(["-D", variable]);
    }
    command.arg(&env.url);
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("pgbench failed ({}): {stderr}{stdout}", output.status).into());
    }
    let failed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("0");
    if failed != "0" {
        return Err(format!("pgbench reported {failed} failed transactions: {stdout}").into());
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| format!("no tps line in pgbench output: {stdout}"))?
        .parse()?;
    Ok(PgbenchRun { tps })
}
