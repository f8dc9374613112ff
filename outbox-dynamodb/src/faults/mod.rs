//! Fault injection into the SDK's request path (feature `fault-injection`), so tests on
//! DynamoDB Local meet what AWS does and Local never does: throttles, cancelled
//! transactions, one failed statement of a PartiQL batch, global indexes lagging
//! their table.
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
//!    "failed" this way has been written. A lagging index ([`Rule::stale_index`]) is
//!    injected this way too: an index query gets the answer an earlier, equal query
//!    got, from before the writes since.
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
//! Local. A lagging index replays whole earlier answers, so it lags by whole queries,
//! not by single writes. Items past their time to live need no fault: DynamoDB Local
//! never deletes them, which is the far end of AWS's deletion delay (typically within
//! days), so every test there already meets them.

mod plan;
mod rule;
#[cfg(test)]
mod tests;

pub use rule::{CancelReason, Fault, Injected, Rule, When};

use std::collections::{BTreeMap, HashMap};
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
use aws_sdk_dynamodb::operation::query::QueryOutput;
use aws_sdk_dynamodb::types::{BatchStatementError, BatchStatementResponse};
use aws_sdk_dynamodb::Client;
use serde_json::Value;

use plan::{index_query_key, operation_of, Action, Plan, Planned};

/// The interceptor hooks' error type.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `X-Amz-Target` prefix of every DynamoDB operation.
const TARGET_PREFIX: &str = "DynamoDB_20120810.";
/// The namespace of DynamoDB's exception names in a JSON error's `__type`.
const ERROR_NAMESPACE: &str = "com.amazonaws.dynamodb.v20120810#";
/// The operations the crate's stores send on their data path (every request but
/// table creation and description).
pub const DATA_OPERATIONS: [&str; 7] = [
    "GetItem",
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "Query",
    "TransactWriteItems",
    "BatchExecuteStatement",
];

/// What a before-send fault sends instead of the request: a read of the account's
/// limits, which changes nothing.
const HARMLESS_TARGET: &str = "DynamoDB_20120810.DescribeLimits";

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
    /// The latest fresh answer of each index query ([`Fault::StaleIndex`]), by
    /// [`index_query_key`]; at most [`KEPT_ANSWERS`].
    answers: HashMap<String, QueryOutput>,
}

/// How many index answers an injector keeps for [`Fault::StaleIndex`]; past it, the
/// oldest are forgotten all at once.
const KEPT_ANSWERS: usize = 4096;

/// The index query an attempt made, when a [`Fault::StaleIndex`] rule may need its
/// answer: kept in the attempt's config bag.
#[derive(Debug, Clone)]
struct IndexQuery(Option<String>);

impl aws_smithy_types::config_bag::Storable for IndexQuery {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
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
                    answers: HashMap::new(),
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

    /// Throttle every operation of [`DATA_OPERATIONS`] at `rate` of its attempts, half
    /// with [`Fault::Throttling`], half with [`Fault::ProvisionedThroughputExceeded`]
    /// (rules added in that order).
    pub fn throttle_data_plane(&self, rate: f64) {
        for operation in DATA_OPERATIONS {
            self.add(Rule::throttle(operation, Fault::Throttling).rate(rate / 2.0));
            self.add(
                Rule::throttle(operation, Fault::ProvisionedThroughputExceeded).rate(rate / 2.0),
            );
        }
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
        let State {
            rng,
            rules,
            counts,
            answers,
        } = &mut *state;
        let rule = rules.iter_mut().find(|rule| {
            rule.operation == operation
                && rule.times != Some(0)
                && rule.matching.as_deref().is_none_or(|m| text.contains(m))
                && (rule.fault != Fault::StaleIndex
                    || index_query_key(text).is_some_and(|key| answers.contains_key(&key)))
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
        let stale_rules = self
            .state()
            .rules
            .iter()
            .any(|r| r.fault == Fault::StaleIndex);
        let query = match (
            stale_rules,
            operation_of(request.headers().get("x-amz-target")),
        ) {
            (true, Some("Query")) => request
                .body()
                .bytes()
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(index_query_key),
            _ => None,
        };
        cfg.interceptor_state().store_put(IndexQuery(query));
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
                // Answered after the query ran: the request goes as it is.
                Action::Stale => {
                    String::from_utf8_lossy(request.body().bytes().unwrap_or_default()).into_owned()
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

    /// Put a failed statement's error entry into a batch's answer; answer an index
    /// query from before, or keep its fresh answer for later.
    fn modify_before_attempt_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(IndexQuery(Some(key))) = cfg.load::<IndexQuery>() {
            if let Some(Ok(output)) = context.output_or_error_mut() {
                if let Some(output) = output.downcast_mut::<QueryOutput>() {
                    let stale = matches!(
                        cfg.load::<Plan>(),
                        Some(Plan(Some(Planned {
                            action: Action::Stale,
                            ..
                        })))
                    );
                    let mut state = self.state();
                    match (stale, state.answers.get(key)) {
                        (true, Some(earlier)) => *output = earlier.clone(),
                        _ => {
                            if state.answers.len() >= KEPT_ANSWERS {
                                state.answers.clear();
                            }
                            state.answers.insert(key.clone(), output.clone());
                        }
                    }
                }
            }
        }
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
