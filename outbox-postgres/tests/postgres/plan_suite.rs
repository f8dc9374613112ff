//! The testkit's plan suite on PostgreSQL: the statements a store's relay calls
//! prepared, captured from `pg_prepared_statements` of a twin's connections while the
//! table was empty, then explained (custom and generic plans) on the relay's own
//! connections after history was bulk-loaded with autovacuum off, so the planner has
//! no statistics.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Disposition, store::Failure, store::Lease,
    store::LeaseToken, store::Settlement, store::StoreCapabilities, MessageId, OutboxAdmin,
    OutboxStore, Result,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::{Fixture, History, PlanFixture, PlanHarness, PlannedStatement, RelayOp};
use sqlx::PgPool;

use outbox_testkit::postgres::{history, plans as postgres_plans};

use crate::plans::{self, Plan, Statement};
use crate::{common, table};

const LONG: Duration = Duration::from_secs(300);

struct PgPlanHarness {
    pool: PgPool,
}

#[derive(Debug)]
struct PgPlanFixture {
    fixture: common::PgFixture,
    /// What each operation prepared, captured on the empty table.
    statements: HashMap<&'static str, Vec<Statement>>,
}

/// The name an operation's statements are kept under.
fn key(op: RelayOp) -> &'static str {
    match op {
        RelayOp::Claim => "claim",
        RelayOp::ClaimIds => "claim ids",
        RelayOp::SettleAndClaim => "settle and claim",
        RelayOp::Complete => "complete",
        RelayOp::Fail => "fail",
        RelayOp::Release => "release",
        RelayOp::Renew => "renew",
        RelayOp::Purge => "purge",
        other => panic!("no capture for {other:?}"),
    }
}

/// Run every relay operation once on a twin of `outbox` while its table is empty (so
/// nothing changes), keeping the statements each prepared.
async fn capture(outbox: &PgOutbox) -> HashMap<&'static str, Vec<Statement>> {
    let twin = plans::twin(outbox).await;
    let lease = Lease {
        id: MessageId::new(),
        token: LeaseToken::new(),
        expires_at: SystemTime::now(),
    };
    let request = || ClaimRequest::new(10, LONG).unwrap();
    let mut out = HashMap::new();
    for op in RelayOp::ALL {
        let statements = plans::prepared_by(&twin, || async {
            match op {
                RelayOp::Claim => drop(twin.claim(request()).await.unwrap()),
                RelayOp::ClaimIds => {
                    let ids = ClaimIds::new(&[MessageId::new()], LONG).unwrap();
                    drop(twin.claim_ids(&ids).await.unwrap());
                }
                RelayOp::SettleAndClaim => {
                    let settle = Settlement {
                        complete: &[lease],
                        fail: &[],
                        release: &[],
                    };
                    drop(twin.settle_and_claim(settle, request()).await.unwrap());
                }
                RelayOp::Complete => drop(twin.complete(&[lease]).await.unwrap()),
                RelayOp::Fail => {
                    let failure = Failure::new(lease, "boom", Disposition::DeadLetter);
                    drop(twin.fail(&[failure]).await.unwrap());
                }
                RelayOp::Release => drop(twin.release(&[lease]).await.unwrap()),
                RelayOp::Renew => drop(twin.renew(&[lease], LONG).await.unwrap()),
                RelayOp::Purge => drop(twin.purge_dispatched(LONG, 100).await.unwrap()),
                _ => {}
            }
        })
        .await;
        out.insert(key(op), statements);
    }
    plans::close(&twin).await;
    out
}

#[async_trait]
impl PlanHarness for PgPlanHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn PlanFixture>> {
        let config = PgOutboxConfig::default()
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = crate::outbox(&self.pool, config).await;
        plans::no_autovacuum(&outbox).await;
        let statements = capture(&outbox).await;
        Ok(Box::new(PgPlanFixture {
            fixture: common::PgFixture { outbox },
            statements,
        }))
    }
}

#[async_trait]
impl PlanFixture for PgPlanFixture {
    fn fixture(&self) -> &dyn Fixture {
        &self.fixture
    }

    async fn add_history(&self, history: History) -> Result<()> {
        let sql = history::insert_history(&table(&self.fixture.outbox));
        let [rows, due_end, settled, settled_or_dead] = history::history_params(&history);
        sqlx::query(&sql)
            .bind(rows)
            .bind(due_end)
            .bind(settled)
            .bind(settled_or_dead)
            .execute(self.fixture.outbox.pool())
            .await
            .map(drop)
            .map_err(common::storage)
    }

    async fn plans(&self, op: RelayOp) -> Result<Vec<PlannedStatement>> {
        let (outbox, statements) = (
            self.fixture.outbox.clone(),
            self.statements[key(op)].clone(),
        );
        // On a blocking thread of its own: the explain futures are not `Send` enough
        // for `async_trait`'s boxed future.
        let plans = tokio::task::spawn_blocking(move || {
            // The purger runs on the outbox's own pool, the rest on the relay's.
            let pool = if op == RelayOp::Purge {
                outbox.pool()
            } else {
                outbox.relay_pool()
            };
            tokio::runtime::Handle::current().block_on(explain_all(&outbox, pool, &statements))
        });
        Ok(plans.await.expect("explaining panicked"))
    }
}

/// The custom and generic plans of `statements` on `pool`'s sessions, with 100 of
/// `outbox`'s ids (at random) as the ids bound.
async fn explain_all(
    outbox: &PgOutbox,
    pool: &PgPool,
    statements: &[Statement],
) -> Vec<PlannedStatement> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM (SELECT id FROM {} ORDER BY random() LIMIT 100) AS s ORDER BY id",
        table(outbox)
    ))
    .fetch_all(outbox.pool())
    .await
    .unwrap();
    let name = outbox.config().table();
    let mut out = Vec::new();
    for statement in statements {
        for (variant, plan) in [("custom", Plan::Custom), ("generic", Plan::Generic)] {
            let args = |types: &[String]| plans::settle_args(types, &ids);
            let text = plans::explain(pool, statement, args, plan).await;
            out.push(PlannedStatement {
                text: statement.text.clone(),
                variant: variant.to_owned(),
                accesses: postgres_plans::accesses(&text, name),
                plan: text,
            });
        }
    }
    out
}

async fn harness() -> Option<PgPlanHarness> {
    let url = common::url("the plan suite")?;
    Some(PgPlanHarness {
        pool: common::pool(&url, 4).await,
    })
}

outbox_testkit::plan_suite!(harness);
