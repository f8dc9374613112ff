//! Query plans of the statements the store really sends, read back from the server
//! (`pg_prepared_statements` of the connections that ran them; the crate exposes no
//! SQL) and explained on the relay's own connections, and the guarantee that claims and
//! settles reach rows through their indexes on a table that was never analyzed, in the
//! plans made for them and in the generic plans cached while the table was empty.

use std::future::Future;
use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::Lease, store::LeaseToken,
    DeadLetterFilter, DeadLetterSelection, MessageId, OutboxAdmin, OutboxStore, Retention,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::postgres::history;
use outbox_testkit::postgres::plans::scans_table;
use sqlx::PgPool;

use crate::{common, table};

const LONG: Duration = Duration::from_secs(300);

/// A statement a store ran: its text and, for a prepared one, its parameter types
/// (otherwise the text casts every parameter).
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    pub(crate) text: String,
    pub(crate) types: Option<Vec<String>>,
}

/// How to plan a statement for `EXPLAIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A plan for the given values, as the first executions get.
    Custom,
    /// The plan cached for any values, as later executions may get.
    Generic,
    /// `EXPLAIN ANALYZE` of a custom plan, in a transaction rolled back afterwards.
    Analyze,
}

/// A twin of `outbox` on pools of one connection (its own and its relay's), so the
/// statements it prepares can be read back from that connection's
/// `pg_prepared_statements`.
pub(crate) async fn twin(outbox: &PgOutbox) -> PgOutbox {
    let url = common::url("statement capture").expect("the caller has a server");
    let pool = common::pool(&url, 1).await;
    let config = outbox.config().clone().with_relay_connections(1);
    PgOutbox::new(pool, config).unwrap()
}

/// Close both of a twin's pools.
pub(crate) async fn close(twin: &PgOutbox) {
    twin.pool().close().await;
    twin.relay_pool().close().await;
}

/// The statements `twin` prepared for the first time while running `op`.
pub(crate) async fn prepared_by<F, Fut>(twin: &PgOutbox, op: F) -> Vec<Statement>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let before = prepared_by_twin(twin).await;
    op().await;
    prepared_by_twin(twin)
        .await
        .into_iter()
        // Names are per connection (`sqlx_s_1`, ...): a statement is new when no
        // statement of that name and text was there before.
        .filter(|(name, new)| {
            !before
                .iter()
                .any(|(b, old)| b == name && old.text == new.text)
        })
        .map(|(_, statement)| statement)
        .collect()
}

/// The one statement `twin` prepared while running `op`.
pub(crate) async fn prepared_one<F, Fut>(twin: &PgOutbox, what: &str, op: F) -> Statement
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut new = prepared_by(twin, op).await;
    assert_eq!(new.len(), 1, "{what} should prepare one statement: {new:?}");
    new.remove(0)
}

/// What both of a twin's connections have prepared.
async fn prepared_by_twin(twin: &PgOutbox) -> Vec<(String, Statement)> {
    let mut all = prepared(twin.pool()).await;
    all.extend(prepared(twin.relay_pool()).await);
    all
}

async fn prepared(pool: &PgPool) -> Vec<(String, Statement)> {
    let rows: Vec<(String, String, Vec<String>)> = sqlx::query_as(
        "SELECT name, statement, parameter_types::text[] FROM pg_prepared_statements",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .filter(|(_, text, _)| !text.contains("pg_prepared_statements"))
        .map(|(name, text, types)| {
            let types = Some(types);
            (name, Statement { text, types })
        })
        .collect()
}

/// The claim statement of `outbox`'s config, captured by claiming from it while
/// nothing is due (so the capture changes nothing).
pub(crate) async fn claim_statement(outbox: &PgOutbox) -> Statement {
    let twin = twin(outbox).await;
    let statement = prepared_one(&twin, "a claim", || async {
        let claimed = twin.claim(ClaimRequest::new(1, LONG).unwrap()).await;
        assert!(
            claimed.unwrap().is_empty(),
            "capture claims while nothing is due"
        );
    })
    .await;
    close(&twin).await;
    statement
}

/// The plan of `statement` for the arguments `args` makes from its parameter types
/// (SQL literals, one per parameter).
pub(crate) async fn explain(
    pool: &PgPool,
    statement: &Statement,
    args: impl FnOnce(&[String]) -> Vec<String>,
    plan: Plan,
) -> String {
    let mut conn = pool.acquire().await.unwrap();
    let prepare = match &statement.types {
        Some(types) => format!(
            "PREPARE obx_explain({}) AS {}",
            types.join(", "),
            statement.text
        ),
        None => format!("PREPARE obx_explain AS {}", statement.text),
    };
    sqlx::raw_sql(&prepare).execute(&mut *conn).await.unwrap();
    let types: Vec<String> = sqlx::query_scalar(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'obx_explain'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let args = args(&types);
    let mode = match plan {
        Plan::Generic => "force_generic_plan",
        Plan::Custom | Plan::Analyze => "force_custom_plan",
    };
    sqlx::raw_sql(&format!("SET plan_cache_mode = {mode}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let options = if plan == Plan::Analyze {
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
        "ANALYZE, COSTS OFF"
    } else {
        "COSTS OFF"
    };
    let lines: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN ({options}) EXECUTE obx_explain({})",
        args.join(", ")
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let cleanup = if plan == Plan::Analyze {
        "ROLLBACK; DEALLOCATE obx_explain; RESET plan_cache_mode"
    } else {
        "DEALLOCATE obx_explain; RESET plan_cache_mode"
    };
    sqlx::raw_sql(cleanup).execute(&mut *conn).await.unwrap();
    lines.join("\n")
}

/// `EXPLAIN ANALYZE` of the claim of `limit` rows (`statement` from
/// [`claim_statement`]), rolled back so nothing stays leased.
pub(crate) async fn explain_claim(pool: &PgPool, statement: &Statement, limit: i64) -> String {
    let args = |_: &[String]| {
        vec![
            limit.to_string(),
            "30000000".to_owned(),
            format!("'{}'::uuid", uuid::Uuid::new_v4()),
        ]
    };
    explain(pool, statement, args, Plan::Analyze).await
}

/// `'{a,b}'::uuid[]`.
fn uuid_array(ids: &[uuid::Uuid]) -> String {
    let items: Vec<String> = ids.iter().map(ToString::to_string).collect();
    format!("'{{{}}}'::uuid[]", items.join(","))
}

/// A SQL array literal of `n` copies of `item`, typed `ty`.
fn repeated(item: &str, n: usize, ty: &str) -> String {
    format!("'{{{}}}'::{ty}", vec![item; n].join(","))
}

/// Arguments for parameters of these types: `ids` for the first `uuid[]`, fresh
/// tokens for the second, and plausible values for the rest.
pub(crate) fn settle_args(types: &[String], ids: &[uuid::Uuid]) -> Vec<String> {
    let tokens: Vec<uuid::Uuid> = ids.iter().map(|_| uuid::Uuid::new_v4()).collect();
    let mut uuid_arrays = [uuid_array(ids), uuid_array(&tokens), uuid_array(ids)].into_iter();
    types
        .iter()
        .map(|ty| match ty.as_str() {
            "uuid[]" => uuid_arrays.next().expect("at most three uuid arrays"),
            "text[]" => repeated("boom", ids.len(), "text[]"),
            "boolean[]" => repeated("f", ids.len(), "boolean[]"),
            "bigint[]" => repeated("1000000", ids.len(), "bigint[]"),
            "bytea[]" => repeated("\\\\x00", ids.len(), "bytea[]"),
            "jsonb[]" => repeated("\"{}\"", ids.len(), "jsonb[]"),
            "uuid" => format!("'{}'::uuid", uuid::Uuid::new_v4()),
            "text" => "'pg.tests'::text".to_owned(),
            "bigint" => "100".to_owned(),
            other => panic!("no test value for a {other} parameter"),
        })
        .collect()
}

/// The enqueue statement of `outbox`'s config, captured in a rolled-back transaction.
async fn enqueue_statement(outbox: &PgOutbox) -> Statement {
    let twin = twin(outbox).await;
    let statement = prepared_one(&twin, "an enqueue", || async {
        let mut tx = twin.pool().begin().await.unwrap();
        twin.enqueue(&mut tx, &[crate::msg(0)]).await.unwrap();
        tx.rollback().await.unwrap();
    })
    .await;
    close(&twin).await;
    statement
}

/// Every statement a store runs per batch, captured on an empty table of `outbox`'s
/// config: named, so a failing assertion says which.
async fn settle_statements(outbox: &PgOutbox) -> Vec<(&'static str, Statement)> {
    let twin = twin(outbox).await;
    let lease = Lease {
        id: MessageId::new(),
        token: LeaseToken::new(),
        expires_at: std::time::SystemTime::now(),
    };
    let mut out = Vec::new();
    let complete = prepared_one(&twin, "a complete", || async {
        let _ = twin.complete(&[lease]).await.unwrap();
    })
    .await;
    out.push(("complete", complete));
    if outbox.config().retention() == Retention::Delete {
        let fail = prepared_one(&twin, "a fail", || async {
            let failure = Failure::new(lease, "boom", Disposition::DeadLetter);
            let _ = twin.fail(&[failure]).await.unwrap();
        })
        .await;
        out.push(("fail", fail));
        let release = prepared_one(&twin, "a release", || async {
            let _ = twin.release(&[lease]).await.unwrap();
        })
        .await;
        out.push(("release", release));
        // A poison row: the claim prepares itself and the dead-lettering statement.
        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, payload, available_at, headers) \
             VALUES (gen_random_uuid(), 'd', '\\x00', now(), '[1]')",
            table(outbox)
        ))
        .execute(outbox.pool())
        .await
        .unwrap();
        let poison = prepared_containing(&twin, "dead_at = now()", || async {
            let got = twin.claim(ClaimRequest::new(10, LONG).unwrap()).await;
            assert!(got.unwrap().is_empty(), "the poison row is dead-lettered");
        })
        .await;
        out.push(("dead-letter claimed rows", poison));
        out.push((
            "release an undecodable claim",
            undecodable_claim(outbox).await,
        ));
        for (what, requeue) in [("requeue ids", true), ("discard ids", false)] {
            let statement = prepared_one(&twin, what, || async {
                let ids = DeadLetterSelection::Ids(vec![MessageId::new()]);
                let changed = if requeue {
                    twin.requeue_dead(&ids).await
                } else {
                    twin.discard_dead(&ids).await
                };
                assert_eq!(changed.unwrap(), 0);
            })
            .await;
            out.push((what, statement));
        }
    }
    close(&twin).await;
    out
}

/// The statement containing `needle` among those `twin` prepared while running `op`.
async fn prepared_containing<F, Fut>(twin: &PgOutbox, needle: &str, op: F) -> Statement
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let new = prepared_by(twin, op).await;
    new.iter()
        .find(|s| s.text.contains(needle))
        .cloned()
        .unwrap_or_else(|| panic!("no statement with {needle:?} among {new:?}"))
}

/// The statement that gives back a claim whose rows do not decode, captured by
/// claiming a row while `attempts` has a type the crate does not read (then restored).
async fn undecodable_claim(outbox: &PgOutbox) -> Statement {
    let t = table(outbox);
    for sql in [
        format!(
            "INSERT INTO {t} (id, destination, payload, available_at) \
             VALUES (gen_random_uuid(), 'd', '\\x00', now())"
        ),
        format!("ALTER TABLE {t} ALTER COLUMN attempts TYPE bigint"),
    ] {
        sqlx::raw_sql(&sql).execute(outbox.pool()).await.unwrap();
    }
    // A twin of its own: one that prepared the claim before the change would fail on
    // its cached plan instead of decoding the rows.
    let fresh = twin(outbox).await;
    let needle = "attempts = greatest(m.attempts - 1, 0)";
    let statement = prepared_containing(&fresh, needle, || async {
        let err = fresh
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), outbox_core::ErrorKind::Decode, "{err}");
    })
    .await;
    close(&fresh).await;
    sqlx::raw_sql(&format!(
        "ALTER TABLE {t} ALTER COLUMN attempts TYPE integer; DELETE FROM {t}"
    ))
    .execute(outbox.pool())
    .await
    .unwrap();
    assert!(
        statement
            .text
            .contains("attempts = greatest(m.attempts - 1, 0)"),
        "{}",
        statement.text
    );
    statement
}

/// The requeue and discard statements for filtered selections.
async fn matching_statements(outbox: &PgOutbox) -> Vec<Statement> {
    let twin = twin(outbox).await;
    let selection = DeadLetterSelection::Matching {
        filter: DeadLetterFilter::default()
            .with_destination("nowhere")
            .unwrap(),
        limit: 100,
    };
    let mut out = Vec::new();
    for requeue in [true, false] {
        out.push(
            prepared_one(&twin, "a filtered requeue or discard", || async {
                let changed = if requeue {
                    twin.requeue_dead(&selection).await
                } else {
                    twin.discard_dead(&selection).await
                };
                assert_eq!(changed.unwrap(), 0);
            })
            .await,
        );
    }
    close(&twin).await;
    out
}

/// Turn autovacuum (and so auto-analyze) off for `outbox`'s table, in case the server
/// runs it. (DDL: it also drops the plans cached for the table.)
pub(crate) async fn no_autovacuum(outbox: &PgOutbox) {
    sqlx::query(&history::disable_autovacuum(&table(outbox)))
        .execute(outbox.pool())
        .await
        .unwrap();
}

/// Load `n` due rows with one `INSERT ... SELECT` into a table without statistics
/// (after [`no_autovacuum`]).
async fn load_without_statistics(outbox: &PgOutbox, n: i64) {
    let t = table(outbox);
    sqlx::query(&history::insert_due(&t))
        .bind(n)
        .execute(outbox.pool())
        .await
        .unwrap();
    let analyzed: bool = sqlx::query_scalar(history::IS_ANALYZED)
        .bind(&t)
        .fetch_one(outbox.pool())
        .await
        .unwrap();
    assert!(!analyzed, "the test needs a table without statistics");
}

/// `n` ids of `outbox`'s table, picked at random, ascending.
async fn random_ids(outbox: &PgOutbox, n: i64) -> Vec<uuid::Uuid> {
    sqlx::query_scalar(&format!(
        "SELECT id FROM (SELECT id FROM {} ORDER BY random() LIMIT $1) AS s ORDER BY id",
        table(outbox)
    ))
    .bind(n)
    .fetch_all(outbox.pool())
    .await
    .unwrap()
}

pg_test! {
    /// On a table bulk-loaded with 100,000 undelivered rows and never analyzed, every
    /// statement that settles a batch reaches its rows through the primary key (never the
    /// due index, never a sequential scan), in its custom and its generic plan, and the
    /// claim reads the due index. (Without statistics, settles written with the due
    /// index's own predicate were planned as a nested loop over that whole index per id:
    /// 3.4 s for a 100-row complete over 57,000 rows.)
    async fn settles_use_the_primary_key_on_a_table_without_statistics(
        pool = common::connect("settle plans without statistics", 2)
    ) {
        let keep = Retention::Keep {
            window: Duration::from_secs(3600),
        };
        for retention in [Retention::Delete, keep] {
            let outbox =
                crate::outbox(&pool, PgOutboxConfig::default().with_retention(retention)).await;
            let claim = claim_statement(&outbox).await;
            let enqueue = enqueue_statement(&outbox).await;
            let settles = settle_statements(&outbox).await;
            let matching = matching_statements(&outbox).await;
            no_autovacuum(&outbox).await;
            load_without_statistics(&outbox, 100_000).await;
            let ids = random_ids(&outbox, 100).await;
            let name = outbox.config().table();
            let (pkey, due, dead) = (
                format!("{name}_pkey"),
                format!("{name}_due"),
                format!("{name}_dead"),
            );

            for plan in [Plan::Custom, Plan::Generic] {
                for (what, statement) in &settles {
                    let args = |types: &[String]| settle_args(types, &ids);
                    // Admin statements run on the outbox's own pool, the rest on the
                    // relay's connections, each with its sessions' settings.
                    let by_id_only = what.ends_with("ids");
                    let on = if by_id_only {
                        &pool
                    } else {
                        outbox.relay_pool()
                    };
                    let text = explain(on, statement, args, plan).await;
                    let keyed = text.contains(&pkey) || (by_id_only && text.contains(&dead));
                    assert!(
                        keyed,
                        "{what} ({plan:?}, {retention:?}) must use {pkey}:\n{text}"
                    );
                    assert!(
                        !text.contains(&due) && !text.contains("Seq Scan"),
                        "{what} ({plan:?}, {retention:?}) must not scan {due} or the table:\n{text}"
                    );
                }
                let args = |types: &[String]| settle_args(types, &ids);
                let text = explain(outbox.relay_pool(), &claim, args, plan).await;
                assert!(
                    text.contains(&due),
                    "the claim ({plan:?}) must read {due}:\n{text}"
                );
                assert!(!text.contains("Seq Scan"), "the claim ({plan:?}):\n{text}");
                // Stored ids are found by the insert's uniqueness check: nothing is read.
                let args = |types: &[String]| settle_args(types, &ids);
                let text = explain(&pool, &enqueue, args, plan).await;
                let reads = text.lines().any(|l| l.contains("Scan") && l.contains(name));
                assert!(
                    !reads,
                    "the enqueue ({plan:?}) must not read the table:\n{text}"
                );
            }

            // Filtered requeues and discards read the dead-letter index once the table has
            // statistics. (Without them, the planner takes `dead_at IS NOT NULL` to match
            // almost every row and may scan the table: these are bounded operator calls,
            // not the relay's path, so that is left to the planner.)
            sqlx::query(&format!("ANALYZE {}", table(&outbox)))
                .execute(&pool)
                .await
                .unwrap();
            for plan in [Plan::Custom, Plan::Generic] {
                for statement in &matching {
                    let args = |types: &[String]| settle_args(types, &ids);
                    let text = explain(&pool, statement, args, plan).await;
                    assert!(text.contains(&dead), "{plan:?}: must read {dead}:\n{text}");
                    assert!(!text.contains("Seq Scan"), "{plan:?}:\n{text}");
                }
            }
        }
    }

    /// Generic plans made while the table was empty stay on their indexes once it has
    /// grown, without statistics, to 100,000 undelivered rows: every statement the relay
    /// sends is prepared on the relay's connection while the table holds a dozen rows
    /// (with generic plans forced, the worst case of PostgreSQL's plan cache), the table
    /// is bulk-loaded, and each cached plan is explained as it would run. (On ordinary
    /// sessions the settle's cached generic plan was a sequential scan joined to the ids:
    /// 2.7 s per 100-row settle once the table had grown.)
    async fn plans_cached_on_an_empty_table_stay_on_their_indexes_after_it_grows(
        (_, outbox) = crate::pg_outbox("cached plans after growth", 2, PgOutboxConfig::default())
    ) {
        no_autovacuum(&outbox).await;
        let twin = twin(&outbox).await;
        let relay = twin.relay_pool();
        sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
            .execute(relay)
            .await
            .unwrap();
        relay_statements_on_a_dozen_rows(&outbox, &twin).await;
        let next = |n| ClaimRequest::new(n, LONG).unwrap();

        load_without_statistics(&outbox, 100_000).await;
        let ids = random_ids(&outbox, 100).await;
        let name = outbox.config().table();
        let (pkey, due) = (format!("{name}_pkey"), format!("{name}_due"));
        let mut conn = relay.acquire().await.unwrap();
        let cached = cached_on(&mut conn, name).await;
        let mut seen = std::collections::BTreeSet::new();
        for (statement, text, types) in &cached {
            let args = settle_args(types, &ids);
            let plan: Vec<String> = sqlx::query_scalar(&format!(
                "EXPLAIN (COSTS OFF) EXECUTE {statement}({})",
                args.join(", ")
            ))
            .fetch_all(&mut *conn)
            .await
            .unwrap();
            let plan = plan.join("\n");
            let claims_due = text.contains("SKIP LOCKED") && !text.contains("= ANY($4");
            let settles = text.contains("unnest(") || text.contains("= ANY($4");
            assert!(!plan.contains("Seq Scan"), "{text}\n{plan}");
            assert!(!plan.contains("Bitmap"), "{text}\n{plan}");
            if text.contains("SKIP LOCKED") {
                // One TID probe per locked row, not the claimed rows rescanned per row.
                let probes = [
                    "TID Cond: (ctid = due.ctid)",
                    "TID Cond: (ctid = ready.ctid)",
                ];
                assert!(
                    probes.iter().any(|p| plan.contains(p)) && !plan.contains("Join Filter"),
                    "a claim must update its rows by ctid, one probe each:\n{text}\n{plan}"
                );
            }
            if text.contains("NOT IN (SELECT x FROM unnest($6") {
                // The settled ids are looked up in a hash, not compared one by one.
                assert!(
                    plan.contains("hashed SubPlan"),
                    "the exclusion must be hashed:\n{text}\n{plan}"
                );
                seen.insert("exclusion");
            }
            if claims_due {
                assert!(
                    plan.contains(&due),
                    "a claim must read {due}:\n{text}\n{plan}"
                );
                seen.insert("claim");
            }
            if settles {
                assert!(
                    plan.contains(&pkey),
                    "must find ids by {pkey}:\n{text}\n{plan}"
                );
                seen.insert("by id");
            }
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            ["by id", "claim", "exclusion"],
            "every kind of relay statement was cached: {cached:?}"
        );
        assert!(
            cached.len() >= 7,
            "claim, claim ids, complete and claim, complete, fail, release, renew: {cached:?}"
        );
        drop(conn);

        // And they run as planned: a whole batch settled and the next claimed.
        let held: Vec<Lease> = twin
            .claim(next(100))
            .await
            .unwrap()
            .iter()
            .map(|c| c.lease)
            .collect();
        assert_eq!(held.len(), 100);
        let settlement = outbox_core::store::Settlement {
            complete: &held,
            ..outbox_core::store::Settlement::default()
        };
        let out = twin.settle_and_claim(settlement, next(100)).await.unwrap();
        assert_eq!(
            (out.completed.applied, out.claimed.unwrap().len()),
            (100, 100)
        );
        close(&twin).await;
    }

    /// The per-key claim, on a table bulk-loaded without statistics with keyed rows, reads
    /// the due index and finds each key's head through the key index: never a sequential
    /// scan, in its custom and its generic plan.
    async fn the_per_key_claim_uses_its_indexes_without_statistics(
        pool = common::connect("per-key claim plan without statistics", 2)
    ) {
        let config = PgOutboxConfig::default().with_ordering(outbox_core::KeyOrder::PerKey);
        let outbox = crate::outbox(&pool, config).await;
        let claim = claim_statement(&outbox).await;
        no_autovacuum(&outbox).await;
        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, partition_key, payload, available_at) \
             SELECT gen_random_uuid(), 'pg.tests', 'k' || (i % 1000), '\\x00', \
                 now() - interval '1 minute' \
             FROM generate_series(1, 100000) AS i",
            table(&outbox)
        ))
        .execute(&pool)
        .await
        .unwrap();
        let name = outbox.config().table();
        for plan in [Plan::Custom, Plan::Generic] {
            let args = |types: &[String]| settle_args(types, &[]);
            let text = explain(outbox.relay_pool(), &claim, args, plan).await;
            assert!(
                text.contains(&format!("{name}_due")) && text.contains(&format!("{name}_key")),
                "the per-key claim ({plan:?}) must read the due and key indexes:\n{text}"
            );
            assert!(
                !text.contains("Seq Scan"),
                "the per-key claim ({plan:?}):\n{text}"
            );
        }
    }

    /// Complete-and-claim is prepared once per relay connection and reused.
    async fn complete_and_claim_is_prepared_once_per_connection(
        (_, outbox) = crate::pg_outbox("prepared complete and claim", 2, PgOutboxConfig::default())
    ) {
        let twin = twin(&outbox).await;
        crate::enqueue(&outbox, &(0..3).map(crate::msg).collect::<Vec<_>>()).await;
        let next = || ClaimRequest::new(1, LONG).unwrap();
        let mut held: Vec<Lease> = twin
            .claim(next())
            .await
            .unwrap()
            .iter()
            .map(|c| c.lease)
            .collect();
        let statement = prepared_one(&twin, "a complete and claim", || async {
            let settlement = outbox_core::store::Settlement {
                complete: &held,
                ..outbox_core::store::Settlement::default()
            };
            let out = twin.settle_and_claim(settlement, next()).await.unwrap();
            assert_eq!(out.completed.applied, 1);
            held = out.claimed.unwrap().iter().map(|c| c.lease).collect();
        })
        .await;
        assert!(statement.text.contains("m.lease_token = l.token"));
        assert!(statement
            .text
            .contains("c.id NOT IN (SELECT x FROM unnest($6::uuid[]) AS x)"));
        let on_relay = prepared(twin.relay_pool()).await;
        assert!(
            on_relay.iter().any(|(_, s)| s.text == statement.text),
            "prepared on the relay's connection"
        );
        let again = prepared_by(&twin, || async {
            let settlement = outbox_core::store::Settlement {
                complete: &held,
                ..outbox_core::store::Settlement::default()
            };
            let out = twin.settle_and_claim(settlement, next()).await.unwrap();
            assert_eq!(out.completed.applied, 1);
            assert_eq!(out.claimed.unwrap().len(), 1);
        })
        .await;
        assert!(again.is_empty(), "reused, not prepared again: {again:?}");
        close(&twin).await;
    }
}

/// Enqueue a dozen messages into `outbox` and send every relay statement through
/// `store` (a twin of it): claim, settle and claim six times, renew, release, claim and
/// fail, claim by id and complete.
async fn relay_statements_on_a_dozen_rows(outbox: &PgOutbox, store: &PgOutbox) {
    let msgs: Vec<_> = (0..12).map(crate::msg).collect();
    crate::enqueue(outbox, &msgs).await;
    let next = |n| ClaimRequest::new(n, LONG).unwrap();
    let mut held: Vec<Lease> = store
        .claim(next(1))
        .await
        .unwrap()
        .iter()
        .map(|c| c.lease)
        .collect();
    for _ in 0..6 {
        let settlement = outbox_core::store::Settlement {
            complete: &held,
            ..outbox_core::store::Settlement::default()
        };
        let out = store.settle_and_claim(settlement, next(1)).await.unwrap();
        assert_eq!(out.completed.applied, 1);
        held = out.claimed.unwrap().iter().map(|c| c.lease).collect();
    }
    assert_eq!(store.renew(&held, LONG).await.unwrap().leases.len(), 1);
    let _ = store.release(&held).await.unwrap();
    let claimed = store.claim(next(2)).await.unwrap();
    let failures: Vec<Failure> = claimed
        .iter()
        .map(|c| Failure::new(c.lease, "boom", Disposition::DeadLetter))
        .collect();
    assert_eq!(store.fail(&failures).await.unwrap().applied, 2);
    let listed = outbox_core::store::ClaimIds::new(&[msgs[11].id()], LONG).unwrap();
    let claimed = store.claim_ids(&listed).await.unwrap();
    let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
    assert_eq!(store.complete(&leases).await.unwrap().applied, 1);
}

/// The statements prepared on `conn` that name `table`: name, text, parameter types.
async fn cached_on(
    conn: &mut sqlx::PgConnection,
    table: &str,
) -> Vec<(String, String, Vec<String>)> {
    sqlx::query_as(
        "SELECT name, statement, parameter_types::text[] FROM pg_prepared_statements \
         WHERE statement LIKE '%' || $1 || '%'",
    )
    .bind(table)
    .fetch_all(conn)
    .await
    .unwrap()
}

pg_test! {
    /// As [`plans_cached_on_an_empty_table_stay_on_their_indexes_after_it_grows`], with
    /// held-lock claims: every statement prepared on the held connection while the table
    /// held a dozen rows (generic plans forced) still reads the outbox through its indexes
    /// once the table has grown, without statistics, to 100,000 rows. (The registry,
    /// one row per open batch, may be read whole.)
    async fn held_lock_plans_cached_on_an_empty_table_stay_on_their_indexes_after_it_grows(
        url = common::service_url("held-lock cached plans after growth")
    ) {
        let pool = common::pool(&url, 2).await;
        let config = PgOutboxConfig::default()
            .with_claim_mode(outbox_core::ClaimMode::HeldLock)
            .with_sweep_interval(Duration::ZERO);
        let outbox = crate::outbox(&pool, config).await;
        no_autovacuum(&outbox).await;
        let store = PgOutbox::new(
            common::pool(&url, 1).await,
            outbox
                .config()
                .clone()
                .with_relay_connections(1)
                .with_held_connections(1),
        )
        .unwrap();
        let held_pool = store.held_pool().expect("held-lock mode").0.clone();
        sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
            .execute(&held_pool)
            .await
            .unwrap();
        relay_statements_on_a_dozen_rows(&outbox, &store).await;
        // Dropping the store gives the held connection back to the pool kept here, its
        // prepared statements intact (its open transaction is rolled back on next use).
        drop(store);

        load_without_statistics(&outbox, 100_000).await;
        let ids = random_ids(&outbox, 100).await;
        let name = outbox.config().table();
        let due = format!("{name}_due");
        let mut conn = held_pool.acquire().await.unwrap();
        let cached = cached_on(&mut conn, name).await;
        let mut claims = 0;
        for (statement, text, types) in &cached {
            let args = settle_args(types, &ids);
            let args = if args.is_empty() {
                String::new()
            } else {
                format!("({})", args.join(", "))
            };
            let plan: Vec<String> =
                sqlx::query_scalar(&format!("EXPLAIN (COSTS OFF) EXECUTE {statement}{args}"))
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap();
            let plan = plan.join("\n");
            assert!(!scans_table(&plan, name), "{text}\n{plan}");
            if text.contains("SKIP LOCKED") && plan.contains(&due) {
                claims += 1;
            }
        }
        assert!(
            claims >= 2,
            "the claims were cached and read {due}: {cached:?}"
        );
        assert!(
            cached.len() >= 5,
            "claim, claim ids, claim excluding, settles: {cached:?}"
        );
        drop(conn);
        held_pool.close().await;
    }
}
