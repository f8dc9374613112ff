//! The one place where SQS errors become [`outbox_core::Error`]s.
//!
//! A whole request (`SendMessageBatch`, `GetQueueUrl`) that fails gives every message
//! it carried the same error, by the SDK's error kind and then SQS's error code (both
//! the JSON protocol's names and the older `AWS.SimpleQueueService.*` query names):
//!
//! | SQS | kind | status |
//! |---|---|---|
//! | `QueueDoesNotExist` / `AWS.SimpleQueueService.NonExistentQueue` | `Publish` | permanent |
//! | `InvalidAddress`, `InvalidMessageContents`, `InvalidParameterValue`, `MissingParameter`, `UnsupportedOperation`, `InvalidAttributeName`, `InvalidAttributeValue` | `Publish` | permanent |
//! | `RequestThrottled`, `ThrottlingException`, `Throttling`, `KmsThrottled`, HTTP 429 | `Contention` | temporary |
//! | `AccessDenied` / `AccessDeniedException`, `InvalidSecurity`, `InvalidClientTokenId`, `UnrecognizedClientException`, `SignatureDoesNotMatch`, `KmsAccessDenied`, `KmsDisabled`, `KmsInvalidKeyUsage`, `KmsInvalidState`, `KmsNotFound`, `KmsOptInRequired` | `Config` | temporary |
//! | `ServiceUnavailable`, `InternalError`, `InternalFailure`, `KmsUnavailable`, HTTP 5xx | `Unavailable` | temporary |
//! | `BatchRequestTooLong` (the size check should prevent it; another batch may fit) | `Publish` | temporary |
//! | any other service error | `Publish` | temporary |
//! | the SDK's timeout, or no response within the request timeout | `Timeout` | temporary |
//! | dispatch failure (connection refused or reset, DNS), an unreadable response | `Unavailable` | temporary |
//! | the request could not be built (no region, an endpoint that does not resolve) | `Config` | temporary |
//!
//! Access and KMS errors are temporary on purpose: an operator fixes a policy or a key
//! and the relay's retries then succeed; the relay still dead-letters after its last
//! attempt.
//!
//! A failed entry of a batch (`BatchResultErrorEntry`) is permanent when SQS says the
//! sender is at fault (`SenderFault: true`), retryable otherwise; it never fails the
//! rest of its request.
//!
//! Codes are from the SQS API reference (`SendMessageBatch`, `GetQueueUrl`, Common
//! Errors).

use std::fmt;

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use outbox_core::{Error, ErrorKind, ErrorStatus, PublishOutcome};

/// Whether a service error code says the queue does not exist.
pub(crate) fn is_queue_gone(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue")
    )
}

/// What a service error with this code (and HTTP status) means.
pub(crate) fn service_status(
    code: Option<&str>,
    http: Option<u16>,
) -> (ErrorKind, ErrorStatus, &'static str) {
    use ErrorKind as K;
    use ErrorStatus::{Permanent, Temporary};
    match code.unwrap_or_default() {
        "QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue" => {
            (K::Publish, Permanent, "the queue does not exist")
        }
        "InvalidAddress"
        | "InvalidMessageContents"
        | "InvalidParameterValue"
        | "MissingParameter"
        | "UnsupportedOperation"
        | "AWS.SimpleQueueService.UnsupportedOperation"
        | "InvalidAttributeName"
        | "InvalidAttributeValue" => (K::Publish, Permanent, "SQS refused the request as invalid"),
        "RequestThrottled"
        | "ThrottlingException"
        | "Throttling"
        | "KmsThrottled"
        | "KMS.ThrottlingException" => (K::Contention, Temporary, "SQS throttled the request"),
        "AccessDenied"
        | "AccessDeniedException"
        | "InvalidSecurity"
        | "InvalidClientTokenId"
        | "UnrecognizedClientException"
        | "SignatureDoesNotMatch"
        | "KmsAccessDenied"
        | "KmsDisabled"
        | "KmsInvalidKeyUsage"
        | "KmsInvalidState"
        | "KmsNotFound"
        | "KmsOptInRequired" => (
            K::Config,
            Temporary,
            "SQS refused the credentials, the permissions or the queue's KMS key",
        ),
        "ServiceUnavailable" | "InternalError" | "InternalFailure" | "KmsUnavailable" => {
            (K::Unavailable, Temporary, "SQS is unavailable")
        }
        "BatchRequestTooLong" | "AWS.SimpleQueueService.BatchRequestTooLong" => (
            K::Publish,
            Temporary,
            "the request was over SQS's size limit",
        ),
        _ => match http {
            Some(429) => (K::Contention, Temporary, "SQS throttled the request"),
            Some(500..=599) => (K::Unavailable, Temporary, "SQS is unavailable"),
            _ => (K::Publish, Temporary, "SQS refused the request"),
        },
    }
}

/// What a failed request `what` (naming the queue) means.
pub(crate) fn request_error<E, R>(what: &str, err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let (kind, status, why): (ErrorKind, ErrorStatus, String) = match &err {
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code();
            let (kind, status, why) = service_status(code, http_status(ctx.raw()));
            let detail = match (code, ctx.err().message()) {
                (Some(code), Some(message)) => format!(" ({code}: {message})"),
                (Some(code), None) => format!(" ({code})"),
                _ => String::new(),
            };
            (kind, status, format!("{why}{detail}"))
        }
        SdkError::TimeoutError(_) => (
            ErrorKind::Timeout,
            ErrorStatus::Temporary,
            "the SDK timed out".to_owned(),
        ),
        SdkError::DispatchFailure(_) => (
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
            "SQS could not be reached".to_owned(),
        ),
        SdkError::ResponseError(_) => (
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
            "the response from SQS could not be read".to_owned(),
        ),
        SdkError::ConstructionFailure(_) => (
            ErrorKind::Config,
            ErrorStatus::Temporary,
            "the request could not be built (check the client's region, endpoint and \
             credentials)"
                .to_owned(),
        ),
        _ => (
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
            "the request failed".to_owned(),
        ),
    };
    Error::new(kind, format!("{what} failed: {why}"))
        .with_status(status)
        .with_source(err)
}

/// The HTTP status of a raw response, when the response type is the SDK's.
fn http_status<R: fmt::Debug + 'static>(raw: &R) -> Option<u16> {
    (raw as &dyn std::any::Any)
        .downcast_ref::<aws_sdk_sqs::config::http::HttpResponse>()
        .map(|r| r.status().as_u16())
}

/// A request that got no answer within the request timeout.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("{what} failed: no answer within {timeout:?}"),
    )
}

/// One failed entry of a `SendMessageBatch`.
pub(crate) fn entry_error(
    queue: &str,
    code: &str,
    sender_fault: bool,
    message: Option<&str>,
) -> Error {
    let detail = match message {
        Some(message) if !message.is_empty() => format!("{code}: {message}"),
        _ => code.to_owned(),
    };
    let (status, whose) = if sender_fault {
        (ErrorStatus::Permanent, "refused the message (sender fault)")
    } else {
        (ErrorStatus::Temporary, "could not take the message now")
    };
    Error::new(
        ErrorKind::Publish,
        format!("SQS queue {queue} {whose}: {detail}"),
    )
    .with_status(status)
}

/// The outcome a failed message gets from its error.
pub(crate) fn outcome(err: &Error) -> PublishOutcome {
    let reason = err.report().to_string();
    if err.is_retryable() {
        PublishOutcome::Retryable(reason)
    } else {
        PublishOutcome::Permanent(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError;
    use aws_sdk_sqs::types::error::QueueDoesNotExist;

    #[test]
    fn service_codes_map_by_code() {
        use ErrorKind as K;
        let table = [
            ("QueueDoesNotExist", K::Publish, false),
            ("AWS.SimpleQueueService.NonExistentQueue", K::Publish, false),
            ("InvalidAddress", K::Publish, false),
            ("InvalidMessageContents", K::Publish, false),
            ("InvalidParameterValue", K::Publish, false),
            ("MissingParameter", K::Publish, false),
            ("UnsupportedOperation", K::Publish, false),
            ("InvalidAttributeName", K::Publish, false),
            ("InvalidAttributeValue", K::Publish, false),
            ("RequestThrottled", K::Contention, true),
            ("ThrottlingException", K::Contention, true),
            ("KmsThrottled", K::Contention, true),
            ("AccessDenied", K::Config, true),
            ("InvalidSecurity", K::Config, true),
            ("KmsAccessDenied", K::Config, true),
            ("KmsNotFound", K::Config, true),
            ("ServiceUnavailable", K::Unavailable, true),
            ("InternalError", K::Unavailable, true),
            ("KmsUnavailable", K::Unavailable, true),
            ("BatchRequestTooLong", K::Publish, true),
            ("SomethingNew", K::Publish, true),
        ];
        for (code, kind, retryable) in table {
            let (k, status, _) = service_status(Some(code), Some(400));
            assert_eq!(
                (k, status == ErrorStatus::Temporary),
                (kind, retryable),
                "{code}"
            );
        }
        assert_eq!(service_status(None, Some(503)).0, K::Unavailable);
        assert_eq!(service_status(Some("x"), Some(429)).0, K::Contention);
        assert_eq!(service_status(None, None).1, ErrorStatus::Temporary);
    }

    #[test]
    fn sdk_errors_map_by_kind() {
        let timeout: SdkError<SendMessageBatchError, ()> = SdkError::timeout_error("slow");
        let e = request_error("SendMessageBatch to q", timeout);
        assert_eq!((e.kind(), e.is_retryable()), (ErrorKind::Timeout, true));
        let built: SdkError<SendMessageBatchError, ()> =
            SdkError::construction_failure("no region");
        let e = request_error("SendMessageBatch to q", built);
        assert_eq!((e.kind(), e.is_retryable()), (ErrorKind::Config, true));
        let missing = SendMessageBatchError::QueueDoesNotExist(
            QueueDoesNotExist::builder()
                .message("gone")
                .meta(
                    aws_sdk_sqs::error::ErrorMetadata::builder()
                        .code("QueueDoesNotExist")
                        .message("gone")
                        .build(),
                )
                .build(),
        );
        let e = request_error(
            "SendMessageBatch to q",
            SdkError::service_error(missing, ()),
        );
        assert_eq!((e.kind(), e.is_retryable()), (ErrorKind::Publish, false));
        assert!(
            e.report().to_string().contains("does not exist"),
            "{}",
            e.report()
        );
    }

    #[test]
    fn entries_are_permanent_only_on_a_sender_fault() {
        let e = entry_error("q", "InvalidParameterValue", true, Some("bad"));
        match outcome(&e) {
            PublishOutcome::Permanent(reason) => {
                assert!(reason.contains("InvalidParameterValue: bad") && reason.contains("q"))
            }
            other => panic!("{other:?}"),
        }
        let e = entry_error("q", "InternalError", false, None);
        assert!(matches!(outcome(&e), PublishOutcome::Retryable(_)));
    }
}
