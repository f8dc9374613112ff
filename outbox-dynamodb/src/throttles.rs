//! Throttled requests, counted per operation, index and reason: an interceptor that
//! [`DynamoOutbox::new`](crate::DynamoOutbox::new) registers on the store's client. It
//! reads every attempt's answer, so throttles the SDK retried away are counted too:
//! they are the early sign that a table or its `due` index lacks capacity.
//!
//! A throttle is any of: a `ThrottlingException`, `ProvisionedThroughputExceededException`
//! or `RequestLimitExceeded` answer; a `TransactionCanceledException` with a
//! `ThrottlingError` or `ProvisionedThroughputExceeded` reason; a batch statement with
//! one of those codes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_dynamodb::config::interceptors::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use serde_json::Value;

/// The `X-Amz-Target` prefix of every DynamoDB operation.
const TARGET_PREFIX: &str = "DynamoDB_20120810.";

/// Throttled attempts of one kind, as DynamoDB reported them; see
/// [`DynamoOutbox::throttled`](crate::DynamoOutbox::throttled).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct Throttled {
    /// The operation, as in the API reference (`"TransactWriteItems"` for enqueues,
    /// `"UpdateItem"` for claims and settles, `"Query"` for the `due` index).
    pub operation: String,
    /// The global secondary index: the one the request read (`IndexName`), or the one
    /// a throttling reason names (a table write held back by its index).
    pub index: Option<String>,
    /// The exception (`"ProvisionedThroughputExceededException"`), or the reason code
    /// of a cancelled transaction's action or a batch statement (`"ThrottlingError"`).
    pub code: String,
    /// The throttling reason DynamoDB gave, when it gave one
    /// (`"IndexWriteKeyRangeThroughputExceeded"`, `"TableWriteAccountLimitExceeded"`).
    pub reason: Option<String>,
    /// How many attempts.
    pub count: u64,
}

/// Key of the counts: operation, index, code, reason.
type Key = (String, Option<String>, String, Option<String>);

/// The counts a store and its interceptor share.
#[derive(Debug, Default)]
pub(crate) struct Throttles {
    pub(crate) total: AtomicU64,
    /// Throttled `TransactWriteItems` attempts: enqueues (and the store's few marker
    /// transactions).
    pub(crate) transactions: AtomicU64,
    kinds: Mutex<BTreeMap<Key, u64>>,
}

impl Throttles {
    fn count(&self, key: Key) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if key.0 == "TransactWriteItems" {
            self.transactions.fetch_add(1, Ordering::Relaxed);
        }
        *self
            .kinds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    pub(crate) fn snapshot(&self) -> Vec<Throttled> {
        self.kinds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|((operation, index, code, reason), count)| Throttled {
                operation: operation.clone(),
                index: index.clone(),
                code: code.clone(),
                reason: reason.clone(),
                count: *count,
            })
            .collect()
    }

    /// Count the throttles in one attempt's answer (`status`, JSON `body`) to
    /// `operation` on `index`.
    pub(crate) fn record(&self, operation: &str, index: Option<&str>, status: u16, body: &[u8]) {
        // Most answers are successes without a statement error: skip them unparsed.
        let batch = operation == "BatchExecuteStatement" && contains(body, b"\"Error\"");
        if status != 400 && !batch {
            return;
        }
        let Ok(answer) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        let key = |code: &str, reason: Option<&Value>| {
            let reason_text = reason
                .and_then(|r| r.get("reason"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let index = index.map(str::to_owned).or_else(|| {
                reason
                    .and_then(|r| r.get("resource"))
                    .and_then(Value::as_str)
                    .and_then(|arn| arn.split_once("/index/"))
                    .map(|(_, index)| index.to_owned())
            });
            (operation.to_owned(), index, code.to_owned(), reason_text)
        };
        if batch {
            let statements = answer.get("Responses").and_then(Value::as_array);
            for statement in statements.into_iter().flatten() {
                let code = statement.pointer("/Error/Code").and_then(Value::as_str);
                if let Some(code) = code.filter(|c| is_throttle_reason(c)) {
                    self.count(key(code, None));
                }
            }
            return;
        }
        let Some(code) = answer
            .get("__type")
            .and_then(Value::as_str)
            .map(|t| t.rsplit('#').next().unwrap_or(t))
        else {
            return;
        };
        match code {
            "ThrottlingException"
            | "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded" => {
                let reasons = ["ThrottlingReasons", "throttlingReasons"]
                    .iter()
                    .find_map(|member| answer.get(member).and_then(Value::as_array));
                match reasons.filter(|r| !r.is_empty()) {
                    Some(reasons) => {
                        for reason in reasons {
                            self.count(key(code, Some(reason)));
                        }
                    }
                    None => self.count(key(code, None)),
                }
            }
            "TransactionCanceledException" => {
                let reasons = answer.get("CancellationReasons").and_then(Value::as_array);
                for reason in reasons.into_iter().flatten() {
                    let code = reason.get("Code").and_then(Value::as_str);
                    if let Some(code) = code.filter(|c| is_throttle_reason(c)) {
                        self.count(key(code, None));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether a cancellation reason or a batch statement's error code is a throttle.
fn is_throttle_reason(code: &str) -> bool {
    matches!(
        code,
        "ThrottlingError" | "ProvisionedThroughputExceeded" | "RequestLimitExceeded"
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The interceptor counting throttles into [`Throttles`].
#[derive(Debug, Clone)]
pub(crate) struct ThrottleCounter(pub(crate) Arc<Throttles>);

/// What the request was: its operation and the index it read, kept from serialisation
/// (the request is gone once sent) to each attempt's end.
#[derive(Debug, Clone)]
struct Sent {
    operation: String,
    index: Option<String>,
}

impl Storable for Sent {
    type Storer = StoreReplace<Self>;
}

impl Intercept for ThrottleCounter {
    fn name(&self) -> &'static str {
        "outbox-dynamodb throttle counter"
    }

    /// Once per operation, before the retry loop: the request as the store built it
    /// (an interceptor registered before this one may rewrite an attempt's request).
    fn read_after_serialization(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let request = context.request();
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.strip_prefix(TARGET_PREFIX))
            .unwrap_or_default()
            .to_owned();
        // Only the `due`, `dead` and `done` queries name an index; the body is small.
        let index = request
            .body()
            .bytes()
            .filter(|body| contains(body, b"\"IndexName\""))
            .and_then(|body| serde_json::from_slice::<Value>(body).ok())
            .and_then(|v| {
                v.get("IndexName")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        cfg.interceptor_state().store_put(Sent { operation, index });
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let (Some(sent), Some(response)) = (cfg.load::<Sent>(), context.response()) else {
            return Ok(());
        };
        if let Some(body) = response.body().bytes() {
            self.0.record(
                &sent.operation,
                sent.index.as_deref(),
                response.status().as_u16(),
                body,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttles_are_counted_by_operation_index_code_and_reason() {
        let t = Throttles::default();
        let index_write = br#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","ThrottlingReasons":[{"reason":"IndexWriteKeyRangeThroughputExceeded","resource":"arn:aws:dynamodb:us-east-1:1:table/t/index/due"}]}"#;
        t.record("TransactWriteItems", None, 400, index_write);
        t.record("TransactWriteItems", None, 400, index_write);
        t.record(
            "Query",
            Some("due"),
            400,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException"}"#,
        );
        t.record(
            "TransactWriteItems",
            None,
            400,
            br#"{"__type":"x#TransactionCanceledException","CancellationReasons":[{"Code":"None"},{"Code":"ThrottlingError"}]}"#,
        );
        t.record(
            "BatchExecuteStatement",
            None,
            200,
            br#"{"Responses":[{"TableName":"t"},{"Error":{"Code":"ProvisionedThroughputExceeded"}},{"Error":{"Code":"ConditionalCheckFailed"}}]}"#,
        );
        // Not throttles.
        t.record(
            "UpdateItem",
            None,
            400,
            br#"{"__type":"x#ConditionalCheckFailedException"}"#,
        );
        t.record("UpdateItem", None, 200, b"{}");
        assert_eq!(t.total.load(Ordering::Relaxed), 5);
        assert_eq!(t.transactions.load(Ordering::Relaxed), 3);
        let kinds = t.snapshot();
        let due_write = kinds
            .iter()
            .find(|k| k.reason.as_deref() == Some("IndexWriteKeyRangeThroughputExceeded"))
            .unwrap();
        assert_eq!(
            (
                due_write.operation.as_str(),
                due_write.index.as_deref(),
                due_write.count
            ),
            ("TransactWriteItems", Some("due"), 2)
        );
        assert!(kinds.iter().any(|k| k.operation == "Query"
            && k.index.as_deref() == Some("due")
            && k.code == "ThrottlingException"));
        assert!(kinds
            .iter()
            .any(|k| k.operation == "BatchExecuteStatement"
                && k.code == "ProvisionedThroughputExceeded"));
    }
}
