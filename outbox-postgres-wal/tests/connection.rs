//! The replication connection's security: TLS against a private cluster serving a
//! certificate made for the test by `openssl` (a CA, and a server certificate for
//! 127.0.0.1), and password authentication (SCRAM, MD5).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use outbox_core::ErrorKind;
use outbox_postgres_wal::{ReplicationTarget, WalOutbox, WalRelay};
use outbox_testkit::RecordingPublisher;
use tokio_util::sync::CancellationToken;

/// Run `openssl` with `args` in `dir`, panicking with its output on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (scripts/services.sh installs it)");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A fresh directory holding `ca.crt`, `server.crt` / `server.key` signed by it for
/// 127.0.0.1, and `other-ca.crt`, a CA that signed nothing here.
fn certificates() -> PathBuf {
    let dir = std::env::temp_dir().join(outbox_testkit::isolation::unique_name());
    std::fs::create_dir_all(&dir).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let (key, crt, subject) = (
            format!("{ca}.key"),
            format!("{ca}.crt"),
            format!("/CN={ca}"),
        );
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
        args.extend(ec);
        args.extend(["-keyout", &key, "-out", &crt]);
        openssl(&dir, &args);
    }
    let mut args = vec!["req", "-new", "-subj", "/CN=127.0.0.1"];
    args.extend(ec);
    args.extend(["-keyout", "server.key", "-out", "server.csr"]);
    openssl(&dir, &args);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    dir
}

/// `env`'s replication URL with `query` appended.
fn target(env: &Env, query: &str) -> ReplicationTarget {
    ReplicationTarget::from_url(&format!("{}?{query}", env.cluster.url())).unwrap()
}

/// Run a relay on `target` until it publishes one committed message; then whether the
/// server saw its replication connection encrypted.
async fn streams(env: &Env, outbox: &WalOutbox, target: ReplicationTarget) -> bool {
    let publisher = RecordingPublisher::new();
    let relay = WalRelay::new(outbox.clone(), target, Arc::new(publisher.clone()), fast()).unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    let sent = messages("tls", 1, 1);
    commit(outbox, &sent).await;
    wait_until(
        "the relay publishes over this connection, or stops",
        || async { publisher.times_seen(sent[0].id()) > 0 || task.is_finished() },
    )
    .await;
    if task.is_finished() {
        let ended = task.await.unwrap();
        panic!(
            "the relay stopped: {:?}",
            ended.map_err(|e| e.report().to_string())
        );
    }
    let ssl: bool = sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    stop.cancel();
    tokio::time::timeout(DEADLINE, task)
        .await
        .expect("the relay stops")
        .unwrap()
        .unwrap();
    ssl
}

/// Run a relay on `target` and expect it to stop by itself with a permanent
/// configuration error.
async fn refused(outbox: &WalOutbox, target: ReplicationTarget) -> outbox_core::Error {
    let err = run_until_refused(outbox, target).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{}", err.report());
    err
}

wal_test! {
    /// `prefer` falls back to plain text and `require` refuses a server without TLS; once
    /// the server has a certificate, `verify-full` streams encrypted with the right CA and
    /// refuses the wrong one, and `prefer` encrypts too.
    async fn the_replication_connection_speaks_tls((env, outbox) = Env::with_outbox(&[])) {
        assert!(!streams(&env, &outbox, target(&env, "sslmode=prefer")).await);
        let err = refused(&outbox, target(&env, "sslmode=require")).await;
        assert!(
            err.report().to_string().to_lowercase().contains("tls"),
            "{}",
            err.report()
        );

        let certs = certificates();
        for file in ["server.crt", "server.key"] {
            env.cluster
                .write_data_file(file, &std::fs::read(certs.join(file)).unwrap());
        }
        // One statement each: ALTER SYSTEM refuses a (multi-statement) transaction.
        for statement in [
            "ALTER SYSTEM SET ssl_cert_file = 'server.crt'",
            "ALTER SYSTEM SET ssl_key_file = 'server.key'",
            "ALTER SYSTEM SET ssl = on",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::raw_sql(statement).execute(&env.pool).await.unwrap();
        }
        wait_until("the server serves TLS", || async {
            sqlx::query_scalar::<_, String>("SHOW ssl")
                .fetch_one(&env.pool)
                .await
                .is_ok_and(|on| on == "on")
        })
        .await;
        // verify-full checks a host name (the client refuses an IP address there).
        let verified = |ca: &str| {
            let url = env.cluster.url().replace("127.0.0.1", "localhost");
            let root = certs.join(ca);
            let query = format!("sslmode=verify-full&sslrootcert={}", root.display());
            ReplicationTarget::from_url(&format!("{url}?{query}")).unwrap()
        };
        refused(&outbox, verified("other-ca.crt")).await;
        assert!(streams(&env, &outbox, verified("ca.crt")).await);
        assert!(streams(&env, &outbox, target(&env, "sslmode=prefer")).await);
        let _ = std::fs::remove_dir_all(&certs);
    }

    /// A replication role with a password gets in by SCRAM and by MD5 (`pg_hba.conf`
    /// asks for each in turn), and a wrong password is a permanent configuration error.
    async fn the_replication_connection_authenticates_by_password(
        (env, outbox) = Env::with_outbox(&[])
    ) {
        let url = |password: &str| {
            let url = env
                .cluster
                .url()
                .replace("postgres@", &format!("relay:{password}@"));
            ReplicationTarget::from_url(&format!("{url}?sslmode=disable")).unwrap()
        };
        for method in ["scram-sha-256", "md5"] {
            // The test's own pool (user postgres) keeps trust; the relay's role must
            // authenticate. The password is stored in the method's own form.
            env.cluster.write_data_file(
                "pg_hba.conf",
                format!(
                    "local all all trust\n\
                     host all postgres 127.0.0.1/32 trust\n\
                     host all relay 127.0.0.1/32 {method}\n\
                     host replication relay 127.0.0.1/32 {method}\n"
                )
                .as_bytes(),
            );
            let encryption = if method == "md5" {
                "md5"
            } else {
                "scram-sha-256"
            };
            // One connection: the SET must hold for the CREATE ROLE.
            let mut conn = env.pool.acquire().await.unwrap();
            for statement in [
                &format!("SET password_encryption = '{encryption}'"),
                "DROP ROLE IF EXISTS relay",
                "CREATE ROLE relay LOGIN REPLICATION PASSWORD 's3cret'",
                "SELECT pg_reload_conf()",
            ] {
                sqlx::raw_sql(statement).execute(&mut *conn).await.unwrap();
            }
            drop(conn);
            let stored: String =
                sqlx::query_scalar("SELECT rolpassword FROM pg_authid WHERE rolname = 'relay'")
                    .fetch_one(&env.pool)
                    .await
                    .unwrap();
            assert!(
                stored.to_lowercase().starts_with(&encryption[..3]),
                "{method}: stored as {stored}"
            );
            let err = run_until_refused(&outbox, url("wrong")).await;
            assert_eq!(err.kind(), ErrorKind::Config, "{method}: {}", err.report());
            assert!(!streams(&env, &outbox, url("s3cret")).await, "{method}");
        }
    }
}
