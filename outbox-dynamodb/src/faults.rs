//! Fault injection into the SDK's request path (feature `fault-injection`), so tests on
//! DynamoDB Local meet what AWS does and Local never does: throttles, cancelled
//! transactions, one failed statement of a PartiQL batch.
//!
//! A [`FaultInjector`] is an interceptor registered on the client's
//! [`Config`](aws_sdk_dynamodb::Config) ([`FaultInjector::client`]). Requests are still
//! serialised, signed and sent to the real endpoint, and responses are deserialised by
//! the SDK's own code, so the store under test sees exactly the errors and outputs the
//! SDK would give it on AWS. Per attempt (the SDK's retries included), each [`Rule`]
//! naming the request's operation draws from one seeded random generator, and the first
//! whose draw falls under its rate injects its [`Fault`]:
//!
//! 1. **Before the request is sent** ([`When::BeforeSend`], the default), the fault
//!    replaces what the request would have done, so nothing of it is applied: the
//!    request is rewritten into a harmless `DescribeLimits` before it is signed, and the
//!    answer is replaced by the fault's error response. For a failed batch statement,
//!    only that statement is removed from the batch; the others run, and the answer gets
//!    the statement's error entry at its place.
//! 2. **After the request was sent** ([`When::AfterSend`]), DynamoDB applied it, and
//!    its answer is replaced: an ambiguous outcome, as when a response is lost. A write
//!    "failed" this way has been written.
//!
//! Every fault injected is counted per operation ([`FaultInjector::injected`]). A
//! [`DynamoOutbox`](crate::DynamoOutbox) built on the client counts injected throttles
//! as it counts real ones ([`OutboxMetrics::throttled`](crate::OutboxMetrics::throttled)).
//!
//! ## Retries
//!
//! The SDK's retry strategy sees injected faults as it would see real ones: the
//! standard strategy retries `ThrottlingException` and
//! `ProvisionedThroughputExceededException` (after a backoff, spending its retry
//! quota), and never `TransactionCanceledException` nor a batch statement's error,
//! which is an entry of a successful answer. Each retry is a new attempt with a new
//! draw. Tests should configure retries explicitly: with
//! `RetryConfig::disabled()` a fault reaches the store as it would after AWS kept
//! throttling past every retry; with a few fast attempts the run shows the SDK
//! absorbing throttles.
//!
//! ## Determinism
//!
//! The seed fixes the sequence of draws, and [`Rule::matching`] and [`Rule::times`]
//! pick requests exactly. Concurrent requests take their draws in the order they
//! reach the interceptor, so a seed replays the same mix of faults, not always on the
//! same requests. Print [`FaultInjector::seed`] with a test's failure.
//!
//! ## Limitations
//!
//! Faults are injected by operation name, request body content and chance; there is
//! no model of capacity. A before-send fault sends a `DescribeLimits` in place of the
//! request (on AWS that needs `dynamodb:DescribeLimits`); it is meant for DynamoDB
//! Local. A lagging global index and items past their time to live are not simulated.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextMut,
    FinalizerInterceptorContextMut,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::operation::batch_execute_statement::BatchExecuteStatementOutput;
use aws_sdk_dynamodb::types::{
    BatchStatementError, BatchStatementErrorCodeEnum, BatchStatementResponse,
};
use aws_sdk_dynamodb::Client;
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use serde_json::{json, Value};

/// The interceptor hooks' error type.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `X-Amz-Target` prefix of every DynamoDB operation.
const TARGET_PREFIX: &str = "DynamoDB_20120810.";
/// The namespace of DynamoDB's exception names in a JSON error's `__type`.
const ERROR_NAMESPACE: &str = "com.amazonaws.dynamodb.v20120810#";
/// What a before-send fault sends instead of the request: a read of the account's
/// limits, which changes nothing.
const HARMLESS_TARGET: &str = "DynamoDB_20120810.DescribeLimits";

/// What an injected fault answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// HTTP 400 `ProvisionedThroughputExceededException` with a throttling reason (the
    /// table's or an index's write or read capacity, by the operation), as a
    /// provisioned table or a hot partition answers.
    ProvisionedThroughputExceeded,
    /// HTTP 400 `ThrottlingException` with a throttling reason, as an on-demand table
    /// past its account quota or its maximum throughput answers.
    Throttling,
    /// HTTP 400 `TransactionCanceledException` (`TransactWriteItems` only): one action
    /// (the first holding [`Rule::matching`]'s text, or one at random) carries this
    /// reason code, the others `None`.
    CancelTransaction(CancelReason),
    /// One statement of a `BatchExecuteStatement` (the first holding
    /// [`Rule::matching`]'s text, or one at random) fails with this code in its entry
    /// of an otherwise successful answer.
    FailStatement(BatchStatementErrorCodeEnum),
}

/// Why an injected [`Fault::CancelTransaction`] cancelled the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// `TransactionConflict`: another request was writing one of the items.
    TransactionConflict,
    /// `ConditionalCheckFailed`: an action's condition did not hold.
    ConditionalCheckFailed,
}

impl CancelReason {
    fn code(self) -> &'static str {
        match self {
            CancelReason::TransactionConflict => "TransactionConflict",
            CancelReason::ConditionalCheckFailed => "ConditionalCheckFailed",
        }
    }

    fn message(self) -> &'static str {
        match self {
            CancelReason::TransactionConflict => "Transaction is ongoing for the item",
            CancelReason::ConditionalCheckFailed => "The conditional request failed",
        }
    }
}

/// When a fault is injected, relative to sending the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum When {
    /// In place of sending it: nothing of the request is applied.
    #[default]
    BeforeSend,
    /// After DynamoDB applied it: only the answer is replaced.
    AfterSend,
}

/// One kind of fault for one operation, at a rate. Built with [`Rule::throttle`],
/// [`Rule::cancel_transaction`] or [`Rule::fail_statement`], then narrowed.
#[derive(Debug, Clone)]
pub struct Rule {
    operation: String,
    fault: Fault,
    when: When,
    rate: f64,
    matching: Option<String>,
    times: Option<u64>,
}

impl Rule {
    /// Throttle `operation` (its name as in the API reference: `"UpdateItem"`,
    /// `"Query"`, `"TransactWriteItems"`) with [`Fault::Throttling`] or
    /// [`Fault::ProvisionedThroughputExceeded`] (any other fault is taken as
    /// [`Fault::Throttling`]).
    pub fn throttle(operation: impl Into<String>, fault: Fault) -> Self {
        let fault = match fault {
            Fault::ProvisionedThroughputExceeded => Fault::ProvisionedThroughputExceeded,
            _ => Fault::Throttling,
        };
        Rule::new(operation.into(), fault)
    }

    /// Cancel `TransactWriteItems` requests for `reason`.
    pub fn cancel_transaction(reason: CancelReason) -> Self {
        Rule::new(
            "TransactWriteItems".into(),
            Fault::CancelTransaction(reason),
        )
    }

    /// Fail one statement of `BatchExecuteStatement` requests with `code`.
    pub fn fail_statement(code: BatchStatementErrorCodeEnum) -> Self {
        Rule::new("BatchExecuteStatement".into(), Fault::FailStatement(code))
    }

    fn new(operation: String, fault: Fault) -> Self {
        Rule {
            operation,
            fault,
            when: When::BeforeSend,
            rate: 1.0,
            matching: None,
            times: None,
        }
    }

    /// Inject on this share of the attempts it applies to (clamped to 0..=1; 1 by
    /// default).
    #[must_use]
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate.clamp(0.0, 1.0);
        self
    }

    /// Inject after the request was sent and applied (see [`When::AfterSend`]).
    #[must_use]
    pub fn after_send(mut self) -> Self {
        self.when = When::AfterSend;
        self
    }

    /// Apply only to requests whose JSON body contains `text` (a message id, say),
    /// and for transactions and batches, hit the action or statement that contains it.
    #[must_use]
    pub fn matching(mut self, text: impl Into<String>) -> Self {
        self.matching = Some(text.into());
        self
    }

    /// Inject at most `n` times.
    #[must_use]
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }
}

/// How many faults of one kind one operation got.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct Injected {
    /// The operation, as in the API reference (`"UpdateItem"`).
    pub operation: String,
    /// The fault: the exception or reason code, then `before send` or `after send`.
    pub fault: String,
    /// How many times.
    pub count: u64,
}

/// Injects [`Rule`]s' faults into the requests of the clients it is registered on; see
/// the [module docs](self). Clones share the rules, the random generator and the
/// counts.
///
/// ```no_run
/// # async fn demo(client: aws_sdk_dynamodb::Client) {
/// use outbox_dynamodb::faults::{Fault, FaultInjector, Rule};
///
/// let faults = FaultInjector::new(7);
/// faults.add(Rule::throttle("UpdateItem", Fault::Throttling).rate(0.05));
/// let client = faults.client(&client);
/// // ... run the store on `client`, then:
/// println!("{faults}");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FaultInjector {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    seed: u64,
    enabled: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    rng: fastrand::Rng,
    rules: Vec<Rule>,
    /// (operation, fault) → count.
    counts: BTreeMap<(String, String), u64>,
}

impl FaultInjector {
    /// An injector with no rules, drawing from a generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        FaultInjector {
            inner: Arc::new(Shared {
                seed,
                enabled: AtomicBool::new(true),
                state: Mutex::new(State {
                    rng: fastrand::Rng::with_seed(seed),
                    rules: Vec::new(),
                    counts: BTreeMap::new(),
                }),
            }),
        }
    }

    /// An injector seeded from the environment variable `var` when it holds a number,
    /// otherwise from a random seed (to replay a run, set `var` to the seed it printed).
    pub fn seeded_from_env(var: &str) -> Self {
        let seed = std::env::var(var)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| fastrand::u64(..));
        FaultInjector::new(seed)
    }

    /// The seed of the random generator.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Add a rule; rules are tried in the order they were added.
    pub fn add(&self, rule: Rule) {
        self.state().rules.push(rule);
    }

    /// Remove every rule (the counts stay).
    pub fn clear(&self) {
        self.state().rules.clear();
    }

    /// Stop (`false`) or resume (`true`) injecting, keeping the rules: for a test's
    /// setup and its final checks.
    pub fn set_enabled(&self, enabled: bool) {
        self.inner.enabled.store(enabled, Ordering::Relaxed);
    }

    /// What was injected so far, by operation and fault.
    pub fn injected(&self) -> Vec<Injected> {
        self.state()
            .counts
            .iter()
            .map(|((operation, fault), count)| Injected {
                operation: operation.clone(),
                fault: fault.clone(),
                count: *count,
            })
            .collect()
    }

    /// How many faults `operation` got so far.
    pub fn count(&self, operation: &str) -> u64 {
        self.state()
            .counts
            .iter()
            .filter(|((op, _), _)| op == operation)
            .map(|(_, n)| n)
            .sum()
    }

    /// How many faults were injected so far.
    pub fn total(&self) -> u64 {
        self.state().counts.values().sum()
    }

    /// A client with `client`'s configuration and this injector registered on it.
    pub fn client(&self, client: &Client) -> Client {
        let config = client
            .config()
            .to_builder()
            .interceptor(self.clone())
            .build();
        Client::from_conf(config)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The fault for one attempt of `operation` with request body `body`, if a rule
    /// fires: counted, with the index of the action or statement it hits.
    fn draw(&self, operation: &str, body: &[u8]) -> Option<Planned> {
        if !self.inner.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let text = std::str::from_utf8(body).unwrap_or_default();
        let mut state = self.state();
        let State { rng, rules, counts } = &mut *state;
        let rule = rules.iter_mut().find(|rule| {
            rule.operation == operation
                && rule.times != Some(0)
                && rule.matching.as_deref().is_none_or(|m| text.contains(m))
                && rng.f64() < rule.rate
        })?;
        if let Some(n) = &mut rule.times {
            *n -= 1;
        }
        let planned = Planned::new(rule, text, rng)?;
        *counts
            .entry((operation.to_owned(), planned.label()))
            .or_default() += 1;
        Some(planned)
    }
}

impl fmt::Display for FaultInjector {
    /// `fault injection seed <seed>: <n> injected (<operation> <fault> ×<n>, ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let injected = self.injected();
        let total: u64 = injected.iter().map(|i| i.count).sum();
        write!(f, "fault injection seed {}: {total} injected", self.seed())?;
        for (i, inj) in injected.iter().enumerate() {
            let sep = if i == 0 { " (" } else { ", " };
            write!(f, "{sep}{} {} ×{}", inj.operation, inj.fault, inj.count)?;
        }
        if !injected.is_empty() {
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// What one attempt gets, kept in the attempt's config bag between the hooks.
#[derive(Debug, Clone)]
struct Planned {
    when: When,
    action: Action,
}

#[derive(Debug, Clone)]
enum Action {
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
}

impl Storable for Planned {
    type Storer = StoreReplace<Self>;
}

/// The attempt's plan, or none (stored on every attempt, so none is left over from an
/// earlier one).
#[derive(Debug, Clone)]
struct Plan(Option<Planned>);

impl Storable for Plan {
    type Storer = StoreReplace<Self>;
}

impl Planned {
    fn new(rule: &Rule, body: &str, rng: &mut fastrand::Rng) -> Option<Self> {
        let action = match &rule.fault {
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

    fn label(&self) -> String {
        let what = match &self.action {
            Action::Answer { label, .. } => label.clone(),
            Action::Statement { code, .. } => format!("statement {}", code.as_str()),
        };
        let when = match self.when {
            When::BeforeSend => "before send",
            When::AfterSend => "after send",
        };
        format!("{what} {when}")
    }
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
fn operation_of(target: Option<&str>) -> Option<&str> {
    target?.strip_prefix(TARGET_PREFIX)
}

impl Intercept for FaultInjector {
    fn name(&self) -> &'static str {
        "outbox-dynamodb fault injection"
    }

    /// Draw this attempt's fault; before send, rewrite the request so that nothing of
    /// it (or of the failed statement) is applied. Before signing, so the rewritten
    /// request is signed as sent.
    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request_mut();
        let planned = match (
            operation_of(request.headers().get("x-amz-target")),
            request.body().bytes(),
        ) {
            (Some(operation), Some(body)) => self.draw(operation, body),
            _ => None,
        };
        if let Some(Planned {
            when: When::BeforeSend,
            action,
        }) = &planned
        {
            let body = match action {
                Action::Answer { .. } => {
                    request
                        .headers_mut()
                        .insert("x-amz-target", HARMLESS_TARGET);
                    "{}".to_owned()
                }
                Action::Statement { index, .. } => {
                    let mut batch: Value =
                        serde_json::from_slice(request.body().bytes().unwrap_or_default())?;
                    if let Some(statements) =
                        batch.get_mut("Statements").and_then(Value::as_array_mut)
                    {
                        statements.remove(*index);
                    }
                    batch.to_string()
                }
            };
            request
                .headers_mut()
                .insert("content-length", body.len().to_string());
            *request.body_mut() = body.into();
        }
        cfg.interceptor_state().store_put(Plan(planned));
        Ok(())
    }

    /// Replace the answer of an attempt that gets one.
    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(Plan(Some(Planned {
            action: Action::Answer { status, body, .. },
            ..
        }))) = cfg.load::<Plan>()
        else {
            return Ok(());
        };
        let mut response = HttpResponse::new((*status).try_into()?, body.clone().into());
        let headers = response.headers_mut();
        headers.insert("content-type", "application/x-amz-json-1.0");
        headers.insert("content-length", body.len().to_string());
        headers.insert("x-amzn-requestid", "outbox-fault-injection");
        *context.response_mut() = response;
        Ok(())
    }

    /// Put a failed statement's error entry into a batch's answer.
    fn modify_before_attempt_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(Plan(Some(Planned {
            when,
            action: Action::Statement { index, code },
        }))) = cfg.load::<Plan>()
        else {
            return Ok(());
        };
        let Some(Ok(output)) = context.output_or_error_mut() else {
            return Ok(());
        };
        let Some(output) = output.downcast_mut::<BatchExecuteStatementOutput>() else {
            return Ok(());
        };
        let responses = output.responses.get_or_insert_with(Vec::new);
        let table = responses.iter().find_map(|r| r.table_name.clone());
        let entry = BatchStatementResponse::builder()
            .error(
                BatchStatementError::builder()
                    .code(code.clone())
                    .message("injected")
                    .build(),
            )
            .set_table_name(table)
            .build();
        let index = (*index).min(responses.len());
        match when {
            When::BeforeSend => responses.insert(index, entry),
            When::AfterSend if index < responses.len() => responses[index] = entry,
            When::AfterSend => responses.push(entry),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(rule: &Rule, body: &str) -> Planned {
        Planned::new(rule, body, &mut fastrand::Rng::with_seed(1)).expect("a plan")
    }

    #[test]
    fn throttles_name_the_table_or_index_and_the_kind_of_capacity() {
        let rule = Rule::throttle("Query", Fault::ProvisionedThroughputExceeded);
        let Action::Answer { status, body, .. } =
            planned(&rule, r#"{"TableName":"t","IndexName":"due"}"#).action
        else {
            panic!("an answer");
        };
        assert_eq!(status, 400);
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body["__type"],
            "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
        );
        assert_eq!(
            body["ThrottlingReasons"][0]["reason"],
            "IndexReadProvisionedThroughputExceeded"
        );
        let rule = Rule::throttle("UpdateItem", Fault::Throttling);
        let Action::Answer { body, .. } = planned(&rule, r#"{"TableName":"t"}"#).action else {
            panic!("an answer");
        };
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body["throttlingReasons"][0]["reason"],
            "TableWriteAccountLimitExceeded"
        );
    }

    #[test]
    fn a_cancelled_transaction_names_the_matching_action() {
        let rule = Rule::cancel_transaction(CancelReason::TransactionConflict).matching("m#second");
        let body = r#"{"TransactItems":[{"Put":{"Item":{"pk":{"S":"m#first"}}}},{"Put":{"Item":{"pk":{"S":"m#second"}}}}]}"#;
        let Action::Answer { body, .. } = planned(&rule, body).action else {
            panic!("an answer");
        };
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["CancellationReasons"][0]["Code"], "None");
        assert_eq!(
            body["CancellationReasons"][1]["Code"],
            "TransactionConflict"
        );
    }

    #[test]
    fn rules_apply_to_their_operation_at_their_rate_and_count() {
        let faults = FaultInjector::new(42);
        faults.add(Rule::throttle("UpdateItem", Fault::Throttling).times(2));
        faults.add(Rule::throttle("Query", Fault::Throttling).rate(0.0));
        for _ in 0..5 {
            faults.draw("UpdateItem", b"{}");
            faults.draw("Query", b"{}");
            faults.draw("GetItem", b"{}");
        }
        assert_eq!(faults.count("UpdateItem"), 2);
        assert_eq!(faults.total(), 2);
        faults.set_enabled(false);
        faults.clear();
        faults.add(Rule::throttle("GetItem", Fault::Throttling));
        assert!(faults.draw("GetItem", b"{}").is_none(), "paused");
        faults.set_enabled(true);
        assert!(faults.draw("GetItem", b"{}").is_some());
        assert!(faults
            .to_string()
            .starts_with("fault injection seed 42: 3 injected"));
    }
}
