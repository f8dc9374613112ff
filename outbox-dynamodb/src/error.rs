//! The one place where AWS SDK errors become [`outbox_core::Error`]s.
//!
//! Service errors are classified by their DynamoDB exception name (the `__type` of the
//! response, as listed under "Errors" in the DynamoDB API reference and in
//! "Error handling with DynamoDB" of the developer guide); transport errors by the SDK's
//! [`SdkError`] variant. The cause stays reachable through
//! [`std::error::Error::source`].

use std::fmt;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::CancellationReason;
use outbox_core::{Error, ErrorKind, ErrorStatus};

/// The kind for a DynamoDB exception name; its retryable status is the kind's
/// [`default_status`](ErrorKind::default_status).
///
/// | exception | kind |
/// |---|---|
/// | `ConditionalCheckFailedException` | Conflict |
/// | `TransactionCanceledException` | by its reasons, see [`kind_for_cancellation`] |
/// | `TransactionConflictException`, `TransactionInProgressException` | Contention |
/// | `ThrottlingException`, `ProvisionedThroughputExceededException`, `RequestLimitExceeded`, `LimitExceededException` | Contention |
/// | `InternalServerError`, `ServiceUnavailable` | Unavailable |
/// | `RequestTimeout`, `RequestTimeoutException` | Timeout |
/// | `ResourceNotFoundException` | Schema |
/// | `ResourceInUseException` | Conflict |
/// | `ValidationException`, `SerializationException`, `IdempotentParameterMismatchException` | InvalidInput |
/// | `ItemCollectionSizeLimitExceededException` | Storage |
/// | `UnrecognizedClientException`, `AccessDeniedException`, `MissingAuthenticationToken`, `MissingAuthenticationTokenException`, `InvalidSignatureException`, `IncompleteSignature`, `ExpiredTokenException` | Config |
/// | anything else | Storage |
pub(crate) fn kind_for_code(code: &str) -> ErrorKind {
    match code {
        "ConditionalCheckFailedException" | "ResourceInUseException" => ErrorKind::Conflict,
        "TransactionConflictException"
        | "TransactionInProgressException"
        | "ThrottlingException"
        | "ProvisionedThroughputExceededException"
        | "RequestLimitExceeded"
        | "LimitExceededException" => ErrorKind::Contention,
        "InternalServerError" | "ServiceUnavailable" => ErrorKind::Unavailable,
        "RequestTimeout" | "RequestTimeoutException" => ErrorKind::Timeout,
        "ResourceNotFoundException" => ErrorKind::Schema,
        "ValidationException"
        | "SerializationException"
        | "IdempotentParameterMismatchException" => ErrorKind::InvalidInput,
        "UnrecognizedClientException"
        | "AccessDeniedException"
        | "MissingAuthenticationToken"
        | "MissingAuthenticationTokenException"
        | "InvalidSignatureException"
        | "IncompleteSignature"
        | "ExpiredTokenException" => ErrorKind::Config,
        _ => ErrorKind::Storage,
    }
}

/// The kind for a `TransactionCanceledException`, from the per-action reason codes
/// (`None` / `"None"` for actions that did not fail). A transient reason wins over a
/// condition failure, because retrying may then succeed:
///
/// | reason | kind |
/// |---|---|
/// | `TransactionConflict`, `ThrottlingError`, `ProvisionedThroughputExceeded`, `RequestLimitExceeded` | Contention |
/// | `ConditionalCheckFailed`, `DuplicateItem` | Conflict |
/// | `ValidationError`, `ItemCollectionSizeLimitExceeded` | InvalidInput |
/// | anything else | Storage |
pub(crate) fn kind_for_cancellation<'a>(
    reasons: impl IntoIterator<Item = Option<&'a str>>,
) -> ErrorKind {
    let mut kind = ErrorKind::Storage;
    let mut rank = 0;
    for code in reasons.into_iter().flatten() {
        let (k, r) = match code {
            "TransactionConflict"
            | "ThrottlingError"
            | "ProvisionedThroughputExceeded"
            | "RequestLimitExceeded" => (ErrorKind::Contention, 3),
            "ConditionalCheckFailed" | "DuplicateItem" => (ErrorKind::Conflict, 2),
            "ValidationError" | "ItemCollectionSizeLimitExceeded" => (ErrorKind::InvalidInput, 1),
            _ => continue,
        };
        if r > rank {
            (kind, rank) = (k, r);
        }
    }
    kind
}

/// The reason codes of a cancelled transaction, one per action in request order
/// (`None` where the action did not fail).
pub(crate) fn reason_codes(reasons: &[CancellationReason]) -> Vec<Option<&str>> {
    reasons
        .iter()
        .map(|r| r.code().filter(|c| *c != "None"))
        .collect()
}

/// Whether a service error is a failed condition: the write's condition is the
/// protocol's check, so callers turn it into a value (a lost lease, a duplicate).
pub fn is_condition_failed<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    err.as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|c| c == "ConditionalCheckFailedException")
}

/// Map an SDK error met while doing `what` (for example `"claim"`) to the workspace
/// error, keeping the SDK error as the source.
pub fn from_sdk<E, R>(what: &str, err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let (kind, message) = match &err {
        SdkError::ServiceError(ctx) => match ctx.err().code() {
            Some(code) => (kind_for_code(code), format!("{what} failed ({code})")),
            None => (ErrorKind::Storage, format!("{what} failed")),
        },
        SdkError::TimeoutError(_) => (ErrorKind::Timeout, format!("{what} timed out")),
        SdkError::DispatchFailure(d) if d.is_timeout() => {
            (ErrorKind::Timeout, format!("{what} timed out"))
        }
        SdkError::DispatchFailure(d) if d.is_user() => {
            (ErrorKind::Config, format!("{what} could not be sent"))
        }
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => (
            ErrorKind::Unavailable,
            format!("{what} failed: DynamoDB unreachable"),
        ),
        SdkError::ConstructionFailure(_) => (
            ErrorKind::Config,
            format!("{what} failed: the request could not be built"),
        ),
        _ => (ErrorKind::Storage, format!("{what} failed")),
    };
    Error::new(kind, message)
        .with_status(kind.default_status())
        .with_source(err)
}

/// A cancelled transaction: the kind follows its reasons ([`kind_for_cancellation`]),
/// the message names the actions that failed.
pub(crate) fn cancelled(
    what: &str,
    reasons: &[Option<&str>],
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    let kind = kind_for_cancellation(reasons.iter().copied());
    let failed: Vec<String> = reasons
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|code| format!("action {i}: {code}")))
        .collect();
    Error::new(kind, format!("{what} cancelled ({})", failed.join(", ")))
        .with_status(kind.default_status())
        .with_source(source)
}

/// An error building a request (a missing required field): a bug of this crate.
pub fn build_error(what: &str, err: aws_sdk_dynamodb::error::BuildError) -> Error {
    Error::new(
        ErrorKind::Storage,
        format!("{what}: request could not be built"),
    )
    .with_status(ErrorStatus::Permanent)
    .with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::operation::put_item::PutItemError;
    use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;
    use std::error::Error as _;

    #[test]
    fn exception_table() {
        let table = [
            ("ConditionalCheckFailedException", ErrorKind::Conflict),
            ("ResourceInUseException", ErrorKind::Conflict),
            ("TransactionConflictException", ErrorKind::Contention),
            ("TransactionInProgressException", ErrorKind::Contention),
            ("ThrottlingException", ErrorKind::Contention),
            (
                "ProvisionedThroughputExceededException",
                ErrorKind::Contention,
            ),
            ("RequestLimitExceeded", ErrorKind::Contention),
            ("LimitExceededException", ErrorKind::Contention),
            ("InternalServerError", ErrorKind::Unavailable),
            ("ServiceUnavailable", ErrorKind::Unavailable),
            ("RequestTimeout", ErrorKind::Timeout),
            ("ResourceNotFoundException", ErrorKind::Schema),
            ("ValidationException", ErrorKind::InvalidInput),
            ("SerializationException", ErrorKind::InvalidInput),
            (
                "IdempotentParameterMismatchException",
                ErrorKind::InvalidInput,
            ),
            (
                "ItemCollectionSizeLimitExceededException",
                ErrorKind::Storage,
            ),
            ("UnrecognizedClientException", ErrorKind::Config),
            ("AccessDeniedException", ErrorKind::Config),
            ("MissingAuthenticationToken", ErrorKind::Config),
            ("InvalidSignatureException", ErrorKind::Config),
            ("ExpiredTokenException", ErrorKind::Config),
            ("SomethingNew", ErrorKind::Storage),
        ];
        for (code, kind) in table {
            assert_eq!(kind_for_code(code), kind, "{code}");
        }
    }

    #[test]
    fn transient_kinds_are_retryable() {
        for code in [
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "InternalServerError",
            "TransactionConflictException",
            "RequestTimeout",
        ] {
            assert_eq!(
                kind_for_code(code).default_status(),
                ErrorStatus::Temporary,
                "{code}"
            );
        }
        for code in [
            "ConditionalCheckFailedException",
            "ValidationException",
            "ResourceNotFoundException",
        ] {
            assert_eq!(
                kind_for_code(code).default_status(),
                ErrorStatus::Permanent,
                "{code}"
            );
        }
    }

    #[test]
    fn cancellation_reasons_pick_the_most_actionable_kind() {
        let none: [Option<&str>; 2] = [None, None];
        assert_eq!(kind_for_cancellation(none), ErrorKind::Storage);
        assert_eq!(
            kind_for_cancellation([None, Some("ConditionalCheckFailed")]),
            ErrorKind::Conflict
        );
        assert_eq!(
            kind_for_cancellation([Some("ConditionalCheckFailed"), Some("TransactionConflict")]),
            ErrorKind::Contention
        );
        assert_eq!(
            kind_for_cancellation([Some("ThrottlingError")]),
            ErrorKind::Contention
        );
        assert_eq!(
            kind_for_cancellation([Some("ProvisionedThroughputExceeded")]),
            ErrorKind::Contention
        );
        assert_eq!(
            kind_for_cancellation([Some("ValidationError"), None]),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            kind_for_cancellation([Some("ItemCollectionSizeLimitExceeded")]),
            ErrorKind::InvalidInput
        );
        let reasons = [
            CancellationReason::builder().code("None").build(),
            CancellationReason::builder()
                .code("ConditionalCheckFailed")
                .build(),
        ];
        assert_eq!(
            reason_codes(&reasons),
            vec![None, Some("ConditionalCheckFailed")]
        );
        let err = cancelled("enqueue", &reason_codes(&reasons), "x");
        assert_eq!(err.kind(), ErrorKind::Conflict);
        assert!(
            err.to_string().contains("action 1: ConditionalCheckFailed"),
            "{err}"
        );
    }

    #[test]
    fn service_errors_keep_their_source_and_name_the_code() {
        let inner = PutItemError::ConditionalCheckFailedException(
            ConditionalCheckFailedException::builder()
                .message("The conditional request failed")
                .meta(
                    aws_sdk_dynamodb::error::ErrorMetadata::builder()
                        .code("ConditionalCheckFailedException")
                        .build(),
                )
                .build(),
        );
        let raw =
            aws_sdk_dynamodb::config::http::HttpResponse::new(400.try_into().unwrap(), "".into());
        let err: SdkError<PutItemError, _> = SdkError::service_error(inner, raw);
        assert!(is_condition_failed(&err));
        let mapped = from_sdk("record", err);
        assert_eq!(mapped.kind(), ErrorKind::Conflict);
        assert_eq!(
            mapped.to_string(),
            "conflict: record failed (ConditionalCheckFailedException)"
        );
        assert!(mapped.source().is_some());
    }

    #[test]
    fn transport_errors_are_retryable() {
        let err: SdkError<PutItemError, aws_sdk_dynamodb::config::http::HttpResponse> =
            SdkError::timeout_error("slow");
        let mapped = from_sdk("claim", err);
        assert_eq!(mapped.kind(), ErrorKind::Timeout);
        assert!(mapped.is_retryable());
        let err: SdkError<PutItemError, aws_sdk_dynamodb::config::http::HttpResponse> =
            SdkError::dispatch_failure(aws_sdk_dynamodb::error::ConnectorError::io(
                "refused".into(),
            ));
        let mapped = from_sdk("claim", err);
        assert_eq!(mapped.kind(), ErrorKind::Unavailable);
        assert!(mapped.is_retryable());
    }
}
