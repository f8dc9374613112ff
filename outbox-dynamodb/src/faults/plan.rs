//! What one attempt gets: the fault a rule drew, as the answer or batch entry it
//! becomes, kept in the attempt's config bag between the interceptor's hooks.

use aws_sdk_dynamodb::types::BatchStatementErrorCodeEnum;
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use serde_json::{json, Value};

use super::rule::{Fault, Rule, When};
use super::{ERROR_NAMESPACE, TARGET_PREFIX};

/// What one attempt gets, kept in the attempt's config bag between the hooks.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub(super) when: When,
    pub(super) action: Action,
}

#[derive(Debug, Clone)]
pub(super) enum Action {
    /// Answer with this status and JSON body.
    Answer {
        status: u16,
        body: String,
        label: String,
    },
    /// Give statement `index` of a batch this error in the answer; before send, the
    /// statement was removed from the request.
    Statement {
        index: usize,
        code: BatchStatementErrorCodeEnum,
    },
    /// Replace the answer of an index query by the one kept for it.
    Stale,
}

impl Storable for Planned {
    type Storer = StoreReplace<Self>;
}

/// The attempt's plan, or none (stored on every attempt, so none is left over from an
/// earlier one).
#[derive(Debug, Clone)]
pub(super) struct Plan(pub(super) Option<Planned>);

impl Storable for Plan {
    type Storer = StoreReplace<Self>;
}

impl Planned {
    pub(super) fn new(rule: &Rule, body: &str, rng: &mut fastrand::Rng) -> Option<Self> {
        let action = match &rule.fault {
            Fault::StaleIndex => {
                index_query_key(body)?;
                Action::Stale
            }
            Fault::ProvisionedThroughputExceeded | Fault::Throttling => {
                let (name, reason_kind) = match rule.fault {
                    Fault::ProvisionedThroughputExceeded => (
                        "ProvisionedThroughputExceededException",
                        "ProvisionedThroughputExceeded",
                    ),
                    _ => ("ThrottlingException", "AccountLimitExceeded"),
                };
                let reason = throttling_reason(&rule.operation, body, reason_kind);
                // The two exceptions spell the list's member differently in the API
                // model; the SDK reads each by its own name.
                let member = if name == "ThrottlingException" {
                    "throttlingReasons"
                } else {
                    "ThrottlingReasons"
                };
                Action::Answer {
                    status: 400,
                    body: json!({
                        "__type": format!("{ERROR_NAMESPACE}{name}"),
                        "message": "Throughput exceeds the current capacity (injected)",
                        member: [reason],
                    })
                    .to_string(),
                    label: name.to_owned(),
                }
            }
            Fault::CancelTransaction(reason) => {
                let request: Value = serde_json::from_str(body).ok()?;
                let actions = request.get("TransactItems")?.as_array()?;
                let hit = pick(actions, rule.matching.as_deref(), rng)?;
                let codes: Vec<&str> = (0..actions.len())
                    .map(|i| if i == hit { reason.code() } else { "None" })
                    .collect();
                let reasons: Vec<Value> = codes
                    .iter()
                    .map(|code| match *code {
                        "None" => json!({ "Code": "None" }),
                        code => json!({ "Code": code, "Message": reason.message() }),
                    })
                    .collect();
                Action::Answer {
                    status: 400,
                    body: json!({
                        "__type": format!("{ERROR_NAMESPACE}TransactionCanceledException"),
                        "Message": format!(
                            "Transaction cancelled, please refer cancellation reasons for \
                             specific reasons [{}]",
                            codes.join(", ")
                        ),
                        "CancellationReasons": reasons,
                    })
                    .to_string(),
                    label: format!("TransactionCanceledException ({})", reason.code()),
                }
            }
            Fault::FailStatement(code) => {
                let request: Value = serde_json::from_str(body).ok()?;
                let statements = request.get("Statements")?.as_array()?;
                let index = pick(statements, rule.matching.as_deref(), rng)?;
                if statements.len() == 1 && rule.when == When::BeforeSend {
                    // A batch cannot be empty: the whole request is replaced, and the
                    // answer is the one failed entry.
                    Action::Answer {
                        status: 200,
                        body: json!({
                            "Responses": [{
                                "Error": { "Code": code.as_str(), "Message": "injected" },
                            }],
                        })
                        .to_string(),
                        label: format!("statement {}", code.as_str()),
                    }
                } else {
                    Action::Statement {
                        index,
                        code: code.clone(),
                    }
                }
            }
        };
        Some(Planned {
            when: rule.when,
            action,
        })
    }

    pub(super) fn label(&self) -> String {
        let what = match &self.action {
            Action::Answer { label, .. } => label.clone(),
            Action::Statement { code, .. } => format!("statement {}", code.as_str()),
            Action::Stale => "stale index answer".to_owned(),
        };
        let when = match self.when {
            When::BeforeSend => "before send",
            When::AfterSend => "after send",
        };
        format!("{what} {when}")
    }
}

/// What makes two `Query` requests of a global secondary index "the same query" for
/// [`Fault::StaleIndex`]: table, index, key condition, filter, string values, page
/// start and size. Number values are left out: the claims' upper bound on `due` is the
/// time of the query. `None` for a request of no index.
pub(super) fn index_query_key(body: &str) -> Option<String> {
    let request: Value = serde_json::from_str(body).ok()?;
    let index = request.get("IndexName")?.as_str()?;
    let strings: std::collections::BTreeMap<&str, &Value> = request
        .get("ExpressionAttributeValues")
        .and_then(Value::as_object)
        .map(|values| {
            values
                .iter()
                .filter(|(_, v)| v.get("N").is_none())
                .map(|(k, v)| (k.as_str(), v))
                .collect()
        })
        .unwrap_or_default();
    Some(
        json!([
            request.get("TableName"),
            index,
            request.get("KeyConditionExpression"),
            request.get("FilterExpression"),
            strings,
            request.get("ExclusiveStartKey"),
            request.get("Limit"),
        ])
        .to_string(),
    )
}

/// The index of the first element whose JSON holds `matching`, or a random one.
fn pick(elements: &[Value], matching: Option<&str>, rng: &mut fastrand::Rng) -> Option<usize> {
    if elements.is_empty() {
        return None;
    }
    match matching {
        Some(m) => elements.iter().position(|e| e.to_string().contains(m)),
        None => Some(rng.usize(..elements.len())),
    }
}

/// A `ThrottlingReason` for `operation` on the request's table (or index): its
/// `reason` is resource type + operation type + `kind`, as in the API reference
/// (`TableWriteProvisionedThroughputExceeded`, `IndexReadAccountLimitExceeded`).
fn throttling_reason(operation: &str, body: &str, kind: &str) -> Value {
    let request: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let table = request
        .get("TableName")
        .and_then(Value::as_str)
        .unwrap_or("table");
    let index = request.get("IndexName").and_then(Value::as_str);
    let read = matches!(
        operation,
        "GetItem" | "Query" | "Scan" | "BatchGetItem" | "TransactGetItems"
    );
    let resource = match index {
        Some(index) => format!("arn:aws:dynamodb:local:000000000000:table/{table}/index/{index}"),
        None => format!("arn:aws:dynamodb:local:000000000000:table/{table}"),
    };
    json!({
        "reason": format!(
            "{}{}{kind}",
            if index.is_some() { "Index" } else { "Table" },
            if read { "Read" } else { "Write" }
        ),
        "resource": resource,
    })
}

/// The operation of a request, from its `X-Amz-Target` header.
pub(super) fn operation_of(target: Option<&str>) -> Option<&str> {
    target?.strip_prefix(TARGET_PREFIX)
}
