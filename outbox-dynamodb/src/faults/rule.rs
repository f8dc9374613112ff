//! What a test asks for: the faults, when they hit, and the rules that pick requests.

use aws_sdk_dynamodb::types::BatchStatementErrorCodeEnum;

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
    /// A `Query` of a global secondary index answered with the answer an earlier query
    /// of the same index, partition, key condition and page got (number values, the
    /// claims' time bounds, aside), as an index lagging its table answers: entries
    /// written since are missing, entries changed or deleted since are as they were.
    /// After the query ran; only when such an earlier answer was seen.
    StaleIndex,
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
    pub(super) fn code(self) -> &'static str {
        match self {
            CancelReason::TransactionConflict => "TransactionConflict",
            CancelReason::ConditionalCheckFailed => "ConditionalCheckFailed",
        }
    }

    pub(super) fn message(self) -> &'static str {
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
/// [`Rule::cancel_transaction`], [`Rule::fail_statement`] or [`Rule::stale_index`],
/// then narrowed.
#[derive(Debug, Clone)]
pub struct Rule {
    pub(super) operation: String,
    pub(super) fault: Fault,
    pub(super) when: When,
    pub(super) rate: f64,
    pub(super) matching: Option<String>,
    pub(super) times: Option<u64>,
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

    /// Answer `Query` requests of global secondary indexes from before the writes that
    /// came since an equal query ([`Fault::StaleIndex`]).
    pub fn stale_index() -> Self {
        Rule::new("Query".into(), Fault::StaleIndex).after_send()
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
