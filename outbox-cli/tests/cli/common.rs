//! Running the real `outbox` binary against a fresh outbox, seeded through the library.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt,
    DeadLetterFilter, DedupStore, MessageId, NewMessage, OutboxAdmin, OutboxStats, OutboxStore,
    Retention,
};
use outbox_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use outbox_dynamodb::aws_sdk_dynamodb::Client;
use outbox_dynamodb::{DynamoDedupConfig, DynamoDedupStore, DynamoOutbox, DynamoOutboxConfig};
use outbox_mysql::sqlx::MySqlPool;
use outbox_mysql::{MySqlDedupConfig, MySqlDedupStore, MySqlOutbox, MySqlOutboxConfig};
use outbox_postgres::sqlx::PgPool;
use outbox_postgres::{PgDedupConfig, PgDedupStore, PgOutbox, PgOutboxConfig};
use outbox_sqlite::{SqliteDedupConfig, SqliteDedupStore, SqliteOutbox, SqliteOutboxConfig};

/// The variable naming the PostgreSQL test database.
pub(crate) const PG_URL: &str = "OUTBOX_PG_URL";
/// The variable naming the MySQL / MariaDB test database.
pub(crate) const MYSQL_URL: &str = "OUTBOX_MYSQL_URL";
/// The variable naming the DynamoDB endpoint (DynamoDB Local).
pub(crate) const DYNAMODB_URL: &str = "OUTBOX_DYNAMODB_URL";
/// Shards of the DynamoDB test outboxes, passed to the binary as `?shards=`.
const DYNAMODB_SHARDS: u16 = 4;

/// What one run of the binary did.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Assert the exit code, showing the output when it is another.
    #[track_caller]
    pub(crate) fn expect(&self, code: i32) -> &Run {
        assert_eq!(
            self.code, code,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Stdout as one JSON document.
    #[track_caller]
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    /// Both streams, for checks that something appears in neither.
    pub(crate) fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Run `outbox ARGS`, with `stdin` as its input (closed when `None`).
pub(crate) fn outbox(args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_remove("OUTBOX_URL")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the outbox binary");
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin piped");
        pipe.write_all(input.as_bytes()).expect("write stdin");
    }
    let out = child
        .wait_with_output()
        .expect("wait for the outbox binary");
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    }
}

/// A fresh name: `obx_<unix secs>_<random>`, which the PostgreSQL tests' stale-schema
/// sweeper drops after an hour.
pub(crate) fn fresh_name() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let random = MessageId::new().as_uuid().simple().to_string();
    format!("obx_{secs}_{}", &random[20..])
}

/// An outbox under test: its URL and options for the binary, and the library's view.
#[derive(Debug)]
pub(crate) struct Fixture {
    pub(crate) url: String,
    /// `--schema S` on PostgreSQL; `--table T --inbox-table I` on DynamoDB.
    extra_args: Vec<String>,
    backend: Backend,
    /// Removed on drop (SQLite).
    dir: Option<PathBuf>,
}

#[derive(Debug)]
enum Backend {
    Postgres(PgOutbox, PgPool, String),
    Sqlite(SqliteOutbox),
    MySql(MySqlOutbox, MySqlPool, String),
    /// The outbox, its client, and the inbox table's name.
    Dynamo(DynamoOutbox, Client, String),
}

/// Kept history, so completed messages show up as dispatched.
const KEEP: Retention = Retention::Keep {
    window: Duration::from_secs(3600),
};

impl Fixture {
    /// An outbox in a fresh schema of the test database (installed when `install`),
    /// or `None` after a visible skip when `OUTBOX_PG_URL` is unset.
    pub(crate) async fn postgres(install: bool) -> Option<Fixture> {
        let url = outbox_testkit::service_url(PG_URL, "outbox-cli PostgreSQL tests")?;
        let pool = PgPool::connect(&url)
            .await
            .expect("connect to OUTBOX_PG_URL");
        let schema = fresh_name();
        let config = PgOutboxConfig::default()
            .with_schema(&schema)
            .with_retention(KEEP);
        let outbox = PgOutbox::new(pool.clone(), config).unwrap();
        if install {
            outbox.install().await.unwrap();
        }
        Some(Fixture {
            url,
            extra_args: vec!["--schema".into(), schema.clone()],
            backend: Backend::Postgres(outbox, pool, schema),
            dir: None,
        })
    }

    /// An outbox in a fresh database of the MySQL / MariaDB server, or `None` after a
    /// visible skip when `OUTBOX_MYSQL_URL` is unset.
    pub(crate) async fn mysql(install: bool) -> Option<Fixture> {
        let url = outbox_testkit::service_url(MYSQL_URL, "outbox-cli MySQL tests")?;
        let pool = MySqlPool::connect(&url)
            .await
            .expect("connect to OUTBOX_MYSQL_URL");
        let schema = fresh_name();
        let config = MySqlOutboxConfig::default()
            .with_schema(&schema)
            .with_retention(KEEP);
        let outbox = MySqlOutbox::new(pool.clone(), config).unwrap();
        if install {
            outbox.install().await.unwrap();
        }
        Some(Fixture {
            url,
            extra_args: vec!["--schema".into(), schema.clone()],
            backend: Backend::MySql(outbox, pool, schema),
            dir: None,
        })
    }

    /// An outbox in a new SQLite file (with the table when `install`).
    pub(crate) async fn sqlite(install: bool) -> Fixture {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "outbox-cli-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("outbox.db");
        let pool = outbox_sqlite::open(&path).await.unwrap();
        let config = SqliteOutboxConfig::default().with_retention(KEEP);
        let outbox = SqliteOutbox::new(pool, config).unwrap();
        if install {
            outbox.install().await.unwrap();
        }
        Fixture {
            url: format!("sqlite://{}", path.display()),
            extra_args: Vec::new(),
            backend: Backend::Sqlite(outbox),
            dir: Some(dir),
        }
    }

    /// An outbox in a fresh DynamoDB table (created when `install`), or `None` after
    /// a visible skip when `OUTBOX_DYNAMODB_URL` is unset. Tables are named like the
    /// DynamoDB tests' ones, whose sweeper deletes them after an hour.
    pub(crate) async fn dynamodb(install: bool) -> Option<Fixture> {
        let endpoint = outbox_testkit::service_url(DYNAMODB_URL, "outbox-cli DynamoDB tests")?;
        let config = outbox_dynamodb::aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("outbox", "outbox", None, None, "tests"))
            .build();
        let client = Client::from_conf(config);
        let (table, inbox) = (fresh_name(), fresh_name());
        let config = DynamoOutboxConfig::default()
            .with_table(&table)
            .with_shards(DYNAMODB_SHARDS)
            .with_retention(KEEP);
        let outbox = DynamoOutbox::new(client.clone(), config).unwrap();
        if install {
            outbox.install().await.unwrap();
        }
        let host = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        Some(Fixture {
            url: format!("dynamodb://{host}?shards={DYNAMODB_SHARDS}"),
            extra_args: vec![
                "--table".into(),
                table,
                "--inbox-table".into(),
                inbox.clone(),
            ],
            backend: Backend::Dynamo(outbox, client, inbox),
            dir: None,
        })
    }

    /// The PostgreSQL schema (empty elsewhere).
    pub(crate) fn schema(&self) -> &str {
        match &self.backend {
            Backend::Postgres(_, _, schema) | Backend::MySql(_, _, schema) => schema,
            Backend::Sqlite(..) | Backend::Dynamo(..) => "",
        }
    }

    /// Whether inbox records carry the expiry their consumer wrote (DynamoDB), rather
    /// than a time `dedup purge --older-than` measures from.
    pub(crate) fn expiry_written_with_records(&self) -> bool {
        matches!(self.backend, Backend::Dynamo(..))
    }

    /// The inbox table's name as the binary is told it.
    pub(crate) fn inbox_table(&self) -> &str {
        match &self.backend {
            Backend::Dynamo(_, _, inbox) => inbox,
            Backend::Postgres(..) | Backend::Sqlite(..) | Backend::MySql(..) => "outbox_inbox",
        }
    }

    /// Run `outbox --url URL [--schema S] ARGS` with stdin closed.
    pub(crate) fn run(&self, args: &[&str]) -> Run {
        self.run_with_input(args, None)
    }

    /// As [`run`](Self::run), with `input` on stdin.
    pub(crate) fn run_with_input(&self, args: &[&str], input: Option<&str>) -> Run {
        let mut all: Vec<&str> = vec!["--url", &self.url];
        // The fixture's own options, but for one the case gives itself.
        for pair in self.extra_args.chunks(2) {
            if !args.contains(&pair[0].as_str()) {
                all.extend(pair.iter().map(String::as_str));
            }
        }
        all.extend(args);
        outbox(&all, input)
    }

    pub(crate) fn store(&self) -> Arc<dyn OutboxStore> {
        match &self.backend {
            Backend::Postgres(o, ..) => Arc::new(o.clone()),
            Backend::Sqlite(o) => Arc::new(o.clone()),
            Backend::MySql(o, ..) => Arc::new(o.clone()),
            Backend::Dynamo(o, ..) => Arc::new(o.clone()),
        }
    }

    pub(crate) fn admin(&self) -> Arc<dyn OutboxAdmin> {
        match &self.backend {
            Backend::Postgres(o, ..) => Arc::new(o.clone()),
            Backend::Sqlite(o) => Arc::new(o.clone()),
            Backend::MySql(o, ..) => Arc::new(o.clone()),
            Backend::Dynamo(o, ..) => Arc::new(o.clone()),
        }
    }

    /// The library's DDL for the outbox table.
    pub(crate) fn ddl(&self) -> String {
        match &self.backend {
            Backend::Postgres(o, ..) => o.ddl(),
            Backend::Sqlite(o) => o.ddl(),
            Backend::MySql(o, ..) => o.ddl(),
            Backend::Dynamo(o, ..) => outbox_core::schema::Schema::ddl(o),
        }
    }

    /// The outbox's layout version, as `schema install` reports it.
    pub(crate) fn layout_version(&self) -> u32 {
        match &self.backend {
            Backend::Postgres(o, ..) => outbox_core::schema::Schema::layout_version(o),
            Backend::Sqlite(o) => outbox_core::schema::Schema::layout_version(o),
            Backend::MySql(o, ..) => outbox_core::schema::Schema::layout_version(o),
            Backend::Dynamo(o, ..) => outbox_core::schema::Schema::layout_version(o),
        }
    }

    /// The inbox table with the CLI's default name, remembering ids for `retention`.
    pub(crate) fn inbox(&self, retention: Duration) -> Arc<dyn DedupStore> {
        match &self.backend {
            Backend::Postgres(_, pool, schema) => {
                let config = PgDedupConfig::default()
                    .with_schema(schema)
                    .with_retention(retention);
                Arc::new(PgDedupStore::new(pool.clone(), config).unwrap())
            }
            Backend::MySql(_, pool, schema) => {
                let config = MySqlDedupConfig::default()
                    .with_schema(schema)
                    .with_retention(retention);
                Arc::new(MySqlDedupStore::new(pool.clone(), config).unwrap())
            }
            Backend::Sqlite(o) => {
                let config = SqliteDedupConfig::default().with_retention(retention);
                Arc::new(SqliteDedupStore::new(o.pool().clone(), config).unwrap())
            }
            Backend::Dynamo(_, client, inbox) => {
                let config = DynamoDedupConfig::default()
                    .with_table(inbox)
                    .with_retention(retention);
                Arc::new(DynamoDedupStore::new(client.clone(), config).unwrap())
            }
        }
    }

    /// Enqueue and commit, through the backend's own enqueue.
    pub(crate) async fn enqueue(&self, messages: &[NewMessage]) {
        match &self.backend {
            Backend::Postgres(o, pool, _) => {
                let mut tx = pool.begin().await.unwrap();
                o.enqueue(&mut tx, messages).await.unwrap();
                tx.commit().await.unwrap();
            }
            Backend::MySql(o, pool, _) => {
                let mut tx = pool.begin().await.unwrap();
                o.enqueue(&mut tx, messages).await.unwrap();
                tx.commit().await.unwrap();
            }
            Backend::Sqlite(o) => {
                let mut tx = o.pool().begin().await.unwrap();
                o.enqueue(&mut tx, messages).await.unwrap();
                tx.commit().await.unwrap();
            }
            Backend::Dynamo(o, ..) => o.enqueue(Vec::new(), messages).await.unwrap(),
        }
    }

    pub(crate) async fn stats(&self) -> OutboxStats {
        self.admin().stats().await.unwrap()
    }

    pub(crate) async fn dead_count(&self, filter: DeadLetterFilter) -> u64 {
        self.admin().count_dead(&filter).await.unwrap()
    }

    /// Five dead letters (three `orders`, then two `payments`, one with a binary
    /// payload and a terminal escape in its error), two dispatched messages, one in
    /// flight and one pending, enqueued in that order.
    pub(crate) async fn seed(&self) -> Seed {
        let text = |destination: &str, n: usize| {
            NewMessage::builder(destination)
                .content_type("application/json")
                .header("trace-id", format!("trace-{n}"))
                .payload(format!(r#"{{"n":{n}}}"#).into_bytes())
                .build()
                .unwrap()
        };
        let mut batch: Vec<NewMessage> = (0..3).map(|n| text("orders", n)).collect();
        batch.push(text("payments", 3));
        batch.push(
            NewMessage::builder("payments")
                .payload(vec![0x00, 0x9f, 0x92, 0x96, 0xff])
                .build()
                .unwrap(),
        );
        batch.extend((5..9).map(|n| text("later", n)));
        self.enqueue(&batch).await;
        let store = self.store();
        let claimed = store
            .claim(ClaimRequest::new(8, Duration::from_secs(600)).unwrap())
            .await
            .unwrap();
        assert_eq!(claimed.len(), 8);
        let (mut dead, mut orders, mut payments) = (Vec::new(), Vec::new(), Vec::new());
        for c in &claimed[..5] {
            let reason = if c.message.destination == "orders" {
                "broker rejected: schema validation failed".to_owned()
            } else {
                "publish timed out\u{1b}[2J".to_owned()
            };
            store
                .fail_one(Failure::new(c.lease, reason, Disposition::DeadLetter))
                .await
                .unwrap();
            dead.push(c.message.id);
            if c.message.destination == "orders" {
                orders.push(c.message.id);
            } else {
                payments.push(c.message.id);
            }
        }
        dead.sort();
        orders.sort();
        for c in &claimed[5..7] {
            store.complete_one(&c.lease).await.unwrap();
        }
        let seed = Seed {
            dead,
            orders,
            binary: batch[4].id(),
            text_payment: batch[3].id(),
            payments,
            in_flight: claimed[7].message.id,
            pending: batch[8].id(),
        };
        seed.check(&self.stats().await);
        seed
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What [`Fixture::seed`] wrote.
#[derive(Debug)]
pub(crate) struct Seed {
    /// Every dead letter, ascending.
    pub(crate) dead: Vec<MessageId>,
    /// The three dead `orders` messages, ascending.
    pub(crate) orders: Vec<MessageId>,
    /// The two dead `payments` messages.
    pub(crate) payments: Vec<MessageId>,
    /// The dead `payments` message with a text payload and an escape in its error.
    pub(crate) text_payment: MessageId,
    /// The dead `payments` message with a binary payload.
    pub(crate) binary: MessageId,
    pub(crate) in_flight: MessageId,
    pub(crate) pending: MessageId,
}

impl Seed {
    /// Assert that `stats` is what the seed left.
    #[track_caller]
    pub(crate) fn check(&self, stats: &OutboxStats) {
        assert_eq!(
            (stats.pending, stats.in_flight, stats.dead, stats.dispatched),
            (1, 1, 5, 2),
            "the seeded outbox is unchanged"
        );
    }
}

/// Lines of `text` split into whitespace-separated cells.
pub(crate) fn cells(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}
