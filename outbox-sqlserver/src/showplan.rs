//! Estimated plans of what the relay and the purger send, for the plan suite
//! (`tests/plans.rs`): `SET SHOWPLAN_XML ON` on a dedicated connection (the setting must
//! be alone in its batch), then each statement exactly as the store builds it, bound to
//! the ids given; with the setting on, the server compiles each statement and returns
//! its plan as XML instead of running it, so nothing changes.
//!
//! [`accesses`] reads a showplan for the ways it reaches the outbox table's rows.

use outbox_core::{MessageId, Result, Retention};
use uuid::Uuid;

use crate::error::from_tiberius;
use crate::exec::query_all_rows;
use crate::session::dedicated;
use crate::sql::{self, FailRow, Settle, Stmt};
use crate::store::MssqlOutbox;

/// Turns estimated plans on for the session (alone in its batch).
pub(crate) const SHOWPLAN_ON: &str = "SET SHOWPLAN_XML ON";

/// One statement the store sends, and its estimated plan.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Explained {
    /// The statement's text.
    pub sql: String,
    /// The showplan XML.
    pub plan: String,
}

/// How a plan step reaches the table's rows.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanAccess {
    /// A seek on the primary key (`<table>_pk`), or a key lookup into the table.
    ByKey,
    /// A seek on this other index.
    Seek(String),
    /// A scan of this index (or of the table: `Table Scan`).
    Scan(String),
}

impl MssqlOutbox {
    /// The statements the store sends for the relay operation `op` (`claim`,
    /// `claim_ids`, `complete`, `fail`, `release`, `settle_and_claim`, `purge`), with
    /// `ids` as the rows they name, and each one's estimated plan.
    ///
    /// # Errors
    /// Mapped driver errors; an unknown `op` is
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput).
    #[doc(hidden)]
    pub async fn explain_relay(&self, op: &str, ids: &[MessageId]) -> Result<Vec<Explained>> {
        let stmts = self.relay_statements(op, ids)?;
        let what = "explain";
        let mut client = dedicated(self.pool(), what).await?;
        let err = |e| from_tiberius(what, e);
        client
            .simple_query(SHOWPLAN_ON)
            .await
            .map_err(err)?
            .into_results()
            .await
            .map_err(err)?;
        let mut out = Vec::new();
        for stmt in stmts {
            let sql = stmt.sql.clone();
            let rows = query_all_rows(&mut client, stmt).await.map_err(err)?;
            for row in rows {
                let plan = match row.try_get::<&str, _>(0) {
                    Ok(Some(text)) => text.to_owned(),
                    _ => row
                        .try_get::<&tiberius::xml::XmlData, _>(0)
                        .map_err(err)?
                        .map(|xml| xml.to_string())
                        .unwrap_or_default(),
                };
                out.push(Explained {
                    sql: sql.clone(),
                    plan,
                });
            }
        }
        Ok(out)
    }

    fn relay_statements(&self, op: &str, ids: &[MessageId]) -> Result<Vec<Stmt>> {
        let t = self.qualified_name();
        let bytes: Vec<[u8; 16]> = ids.iter().map(|id| *id.as_uuid().as_bytes()).collect();
        let token = *Uuid::now_v7().as_bytes();
        let ordering = self.config().ordering();
        let leases: Vec<([u8; 16], [u8; 16])> = bytes.iter().map(|id| (*id, token)).collect();
        let complete = match self.config().retention() {
            Retention::Delete => Settle::Delete,
            _ => Settle::Dispatch,
        };
        let claim = crate::claim::claim(t, ordering, 10, 30_000_000, token, None);
        Ok(match op {
            "claim" => vec![claim],
            "claim_ids" => vec![crate::claim::claim(
                t,
                ordering,
                bytes.len(),
                30_000_000,
                token,
                Some(&bytes),
            )],
            "complete" => vec![sql::settle(t, complete, &leases)],
            "release" => vec![sql::settle(t, Settle::Release, &leases)],
            "fail" => {
                let rows: Vec<FailRow> = bytes
                    .iter()
                    .map(|id| FailRow {
                        id: *id,
                        token,
                        error: "plan".to_owned(),
                        dead: false,
                        retry_us: 1_000_000,
                    })
                    .collect();
                vec![sql::fail(t, &rows)]
            }
            "settle_and_claim" => vec![sql::settle(t, complete, &leases), claim],
            "purge" => vec![crate::admin::purge_dispatched(t, 1_000_000, 100)],
            other => {
                return Err(outbox_core::Error::invalid_input(format!(
                    "no relay operation {other}"
                )))
            }
        })
    }
}

/// The value of attribute `name` in the element text `tag`.
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    tag[at..].split('"').next()
}

/// Every access to `table` (unquoted name) in a showplan, in plan order: each
/// `RelOp` whose operator is an index or table scan or seek, with the `Object` it
/// reads.
#[doc(hidden)]
pub fn accesses(plan: &str, table: &str) -> Vec<PlanAccess> {
    let quoted_table = format!("[{table}]");
    let pk = format!("[{table}_pk]");
    let mut out = Vec::new();
    let mut rest = plan;
    while let Some(at) = rest.find("<RelOp ") {
        rest = &rest[at + 1..];
        let tag = &rest[..rest.find('>').unwrap_or(rest.len())];
        let op = attribute(tag, "PhysicalOp").unwrap_or("");
        // The operator element follows the RelOp's own children (OutputList, ...) and
        // comes before any nested RelOp.
        let scope_end = rest[1..].find("<RelOp ").map_or(rest.len(), |e| e + 1);
        let scope = &rest[..scope_end];
        let Some(operator) = ["<IndexScan", "<TableScan"]
            .iter()
            .filter_map(|el| scope.find(el))
            .min()
        else {
            continue;
        };
        let operator_tag = &scope[operator
            ..scope[operator..]
                .find('>')
                .map_or(scope.len(), |e| operator + e)];
        let Some(object) = scope[operator..].find("<Object ") else {
            continue;
        };
        let object = &scope[operator + object..];
        let object = &object[..object.find('>').unwrap_or(object.len())];
        if attribute(object, "Table") != Some(quoted_table.as_str()) {
            continue;
        }
        let index = attribute(object, "Index").unwrap_or("").to_owned();
        let lookup = attribute(operator_tag, "Lookup").is_some_and(|v| v == "1" || v == "true");
        out.push(match op {
            "Index Seek" | "Clustered Index Seek" if lookup || index == pk => PlanAccess::ByKey,
            "Index Seek" | "Clustered Index Seek" => PlanAccess::Seek(index),
            "RID Lookup" | "Key Lookup" => PlanAccess::ByKey,
            _ => PlanAccess::Scan(if index.is_empty() {
                op.to_owned()
            } else {
                index
            }),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of a showplan (the `RelOp`/`IndexScan`/`Object` elements of the
    /// showplan XML schema), trimmed to what [`accesses`] reads.
    const PLAN: &str = r#"<ShowPlanXML><BatchSequence><Batch><Statements><StmtSimple>
<QueryPlan><RelOp NodeId="0" PhysicalOp="Clustered Index Update" LogicalOp="Update">
<OutputList/><Update><Object Database="[db]" Schema="[s]" Table="[t]" Index="[t_clustered]"/>
<RelOp NodeId="1" PhysicalOp="Nested Loops" LogicalOp="Inner Join"><OutputList/><NestedLoops>
<RelOp NodeId="2" PhysicalOp="Index Seek" LogicalOp="Index Seek"><OutputList/>
<IndexScan Ordered="1"><DefinedValues/><Object Database="[db]" Schema="[s]" Table="[t]" Index="[t_due]" Filtered="1"/></IndexScan></RelOp>
<RelOp NodeId="3" PhysicalOp="Clustered Index Seek" LogicalOp="Clustered Index Seek"><OutputList/>
<IndexScan Lookup="1" Ordered="1"><Object Database="[db]" Schema="[s]" Table="[t]" Index="[t_clustered]"/></IndexScan></RelOp>
<RelOp NodeId="4" PhysicalOp="Index Seek" LogicalOp="Index Seek"><OutputList/>
<IndexScan Ordered="1"><Object Database="[db]" Schema="[s]" Table="[t]" Index="[t_pk]"/></IndexScan></RelOp>
<RelOp NodeId="5" PhysicalOp="Index Scan" LogicalOp="Index Scan"><OutputList/>
<IndexScan Ordered="0"><Object Database="[db]" Schema="[s]" Table="[t]" Index="[t_dead]"/></IndexScan></RelOp>
<RelOp NodeId="6" PhysicalOp="Clustered Index Scan" LogicalOp="Clustered Index Scan"><OutputList/>
<IndexScan Ordered="0"><Object Database="[db]" Schema="[s]" Table="[other]" Index="[other_pk]"/></IndexScan></RelOp>
</NestedLoops></RelOp></Update></RelOp></QueryPlan></StmtSimple></Statements></Batch></BatchSequence></ShowPlanXML>"#;

    #[test]
    fn a_showplan_is_read_for_the_accesses_to_one_table() {
        assert_eq!(
            accesses(PLAN, "t"),
            vec![
                PlanAccess::Seek("[t_due]".into()),
                PlanAccess::ByKey,
                PlanAccess::ByKey,
                PlanAccess::Scan("[t_dead]".into()),
            ]
        );
        assert!(accesses(PLAN, "nothing").is_empty());
        assert_eq!(attribute(r#"<X A="1" B="two">"#, "B"), Some("two"));
        assert_eq!(attribute(r#"<X A="1">"#, "B"), None);
    }
}
