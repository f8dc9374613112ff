//! The one place where SQS errors become [`outbox_core::Error`]s.
//!
//! A whole request (`SendMessageBatch`, `GetQueueUrl`) that fails gives every message
//! it carried the same error, by the SDK's error kind and then the error code the SDK
//! reports. SQS answers in its JSON protocol with an `x-amzn-query-error` header, and
//! the SDK takes the code from that header, so the codes are the query protocol's
//! (`AWS.SimpleQueueService.NonExistentQueue`, `KMS.ThrottlingException`); the JSON
//! protocol's shape names (`QueueDoesNotExist`, `KmsThrottled`), which an endpoint
//! without the header reports, are matched too.
//!
//! | SQS (as the SDK reports it) | kind | status |
//! |---|---|---|
//! | `AWS.SimpleQueueService.NonExistentQueue` / `QueueDoesNotExist` | `Publish` | permanent |
//! | `InvalidParameterValue`, `InvalidMessageContents`, `MissingParameter`, `InvalidAttributeName`, `InvalidAttributeValue`, `AWS.SimpleQueueService.BatchRequestTooLong`, `AWS.SimpleQueueService.BatchEntryIdsNotDistinct`, `AWS.SimpleQueueService.InvalidBatchEntryId`, `AWS.SimpleQueueService.TooManyEntriesInBatchRequest`, `AWS.SimpleQueueService.EmptyBatchRequest` (and their shape names) | `Publish` | permanent, per entry (below) |
//! | `InvalidAddress`, `AWS.SimpleQueueService.UnsupportedOperation` / `UnsupportedOperation` | `Publish` | permanent |
//! | `RequestThrottled`, `KMS.ThrottlingException` / `KmsThrottled`, `ThrottlingException`, `Throttling`, HTTP 429 | `Contention` | temporary |
//! | `InvalidSecurity`, `AccessDenied` / `AccessDeniedException`, `InvalidClientTokenId`, `UnrecognizedClientException`, `SignatureDoesNotMatch`, `KMS.AccessDeniedException`, `KMS.DisabledException`, `KMS.InvalidKeyUsageException`, `KMS.InvalidStateException`, `KMS.NotFoundException`, `KMS.OptInRequired` (and their `Kms*` shape names) | `Config` | temporary |
//! | `ServiceUnavailable`, `InternalError`, `InternalFailure`, `KMS.KeyUnavailableException` / `KmsUnavailable`, HTTP 5xx | `Unavailable` | temporary |
//! | any other service error | `Publish` | temporary |
//! | the SDK's timeout, or no response within the request timeout | `Timeout` | temporary |
//! | dispatch failure (connection refused or reset, DNS), an unreadable response | `Unavailable` | temporary |
//! | the request could not be built (no region, an endpoint that does not resolve) | `Config` | temporary |
//!
//! "Per entry": SQS refused the request for what it carries, which may be one entry's
//! fault, so a request of several entries refused so is sent again one entry per
//! request, and only the entries refused alone are permanent.
//!
//! Access and KMS errors are temporary on purpose: an operator fixes a policy or a key
//! and the relay's retries then succeed; the relay still dead-letters after its last
//! attempt.
//!
//! A failed entry of a batch (`BatchResultErrorEntry`) goes through the same table by
//! its code first (a throttled entry is retryable even when SQS marks it a sender
//! fault); a code the table does not know is permanent when SQS says the sender is at
//! fault (`SenderFault: true`) and retryable otherwise. It never fails the rest of its
//! request.
//!
//! Codes are those the SDK (aws-sdk-sqs 1.119) matches in its error parsers for
//! `SendMessageBatch`, `SendMessage` and `GetQueueUrl`, and SQS's Common Errors.

use std::fmt;

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use outbox_core::{Error, ErrorKind, ErrorStatus};

/// Whether a service error code says the queue does not exist.
pub(crate) fn is_queue_gone(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist")
    )
}

/// Whether a service error code says SQS refused the request for what it carries,
/// which may be the fault of one entry alone.
pub(crate) fn blames_content(code: Option<&str>) -> bool {
    matches!(
        code,
        Some(
            "InvalidParameterValue"
                | "InvalidMessageContents"
                | "MissingParameter"
                | "InvalidAttributeName"
                | "InvalidAttributeValue"
                | "AWS.SimpleQueueService.BatchRequestTooLong"
                | "BatchRequestTooLong"
                | "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
                | "BatchEntryIdsNotDistinct"
                | "AWS.SimpleQueueService.InvalidBatchEntryId"
                | "InvalidBatchEntryId"
                | "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
                | "TooManyEntriesInBatchRequest"
                | "AWS.SimpleQueueService.EmptyBatchRequest"
                | "EmptyBatchRequest"
        )
    )
}

/// What a service error code means, when the table knows it.
fn known_code(code: &str) -> Option<(ErrorKind, ErrorStatus, &'static str)> {
    use ErrorKind as K;
    use ErrorStatus::{Permanent, Temporary};
    if is_queue_gone(Some(code)) {
        return Some((K::Publish, Permanent, "the queue does not exist"));
    }
    if blames_content(Some(code)) {
        return Some((K::Publish, Permanent, "SQS refused the request as invalid"));
    }
    Some(match code {
        "InvalidAddress"
        | "AWS.SimpleQueueService.UnsupportedOperation"
        | "UnsupportedOperation" => (K::Publish, Permanent, "SQS refused the request as invalid"),
        "RequestThrottled"
        | "KMS.ThrottlingException"
        | "KmsThrottled"
        | "ThrottlingException"
        | "Throttling" => (K::Contention, Temporary, "SQS throttled the request"),
        "InvalidSecurity"
        | "AccessDenied"
        | "AccessDeniedException"
        | "InvalidClientTokenId"
        | "UnrecognizedClientException"
        | "SignatureDoesNotMatch"
        | "KMS.AccessDeniedException"
        | "KmsAccessDenied"
        | "KMS.DisabledException"
        | "KmsDisabled"
        | "KMS.InvalidKeyUsageException"
        | "KmsInvalidKeyUsage"
        | "KMS.InvalidStateException"
        | "KmsInvalidState"
        | "KMS.NotFoundException"
        | "KmsNotFound"
        | "KMS.OptInRequired"
        | "KmsOptInRequired" => (
            K::Config,
            Temporary,
            "SQS refused the credentials, the permissions or the queue's KMS key",
        ),
        "ServiceUnavailable"
        | "InternalError"
        | "InternalFailure"
        | "KMS.KeyUnavailableException"
        | "KmsUnavailable" => (K::Unavailable, Temporary, "SQS is unavailable"),
        _ => return None,
    })
}

/// What a service error with this code (and HTTP status) means.
pub(crate) fn service_status(
    code: Option<&str>,
    http: Option<u16>,
) -> (ErrorKind, ErrorStatus, &'static str) {
    use ErrorKind as K;
    use ErrorStatus::Temporary;
    if let Some(known) = code.and_then(known_code) {
        return known;
    }
    match http {
        Some(429) => (K::Contention, Temporary, "SQS throttled the request"),
        Some(500..=599) => (K::Unavailable, Temporary, "SQS is unavailable"),
        _ => (K::Publish, Temporary, "SQS refused the request"),
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

/// One failed entry of a `SendMessageBatch`: by the table when it knows the code,
/// else by `sender_fault`.
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
    let (kind, status, whose) = match known_code(code) {
        Some((kind, status, why)) => (kind, status, why),
        None if sender_fault => (
            ErrorKind::Publish,
            ErrorStatus::Permanent,
            "refused the message (sender fault)",
        ),
        None => (
            ErrorKind::Publish,
            ErrorStatus::Temporary,
            "could not take the message now",
        ),
    };
    Error::new(kind, format!("SQS queue {queue}: {whose}: {detail}")).with_status(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError;
    use aws_sdk_sqs::types::error::QueueDoesNotExist;
    use outbox_core::PublishOutcome;

    #[test]
    fn service_codes_map_by_code() {
        use ErrorKind as K;
        // (code as the SDK reports it, kind, retryable, per entry)
        let table = [
            (
                "AWS.SimpleQueueService.NonExistentQueue",
                K::Publish,
                false,
                false,
            ),
            ("QueueDoesNotExist", K::Publish, false, false),
            ("InvalidParameterValue", K::Publish, false, true),
            ("InvalidMessageContents", K::Publish, false, true),
            ("MissingParameter", K::Publish, false, true),
            ("InvalidAttributeName", K::Publish, false, true),
            ("InvalidAttributeValue", K::Publish, false, true),
            (
                "AWS.SimpleQueueService.BatchRequestTooLong",
                K::Publish,
                false,
                true,
            ),
            (
                "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                K::Publish,
                false,
                true,
            ),
            (
                "AWS.SimpleQueueService.InvalidBatchEntryId",
                K::Publish,
                false,
                true,
            ),
            (
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                K::Publish,
                false,
                true,
            ),
            (
                "AWS.SimpleQueueService.EmptyBatchRequest",
                K::Publish,
                false,
                true,
            ),
            ("InvalidAddress", K::Publish, false, false),
            (
                "AWS.SimpleQueueService.UnsupportedOperation",
                K::Publish,
                false,
                false,
            ),
            ("RequestThrottled", K::Contention, true, false),
            ("KMS.ThrottlingException", K::Contention, true, false),
            ("KmsThrottled", K::Contention, true, false),
            ("InvalidSecurity", K::Config, true, false),
            ("AccessDeniedException", K::Config, true, false),
            ("KMS.AccessDeniedException", K::Config, true, false),
            ("KMS.DisabledException", K::Config, true, false),
            ("KMS.InvalidKeyUsageException", K::Config, true, false),
            ("KMS.InvalidStateException", K::Config, true, false),
            ("KMS.NotFoundException", K::Config, true, false),
            ("KMS.OptInRequired", K::Config, true, false),
            ("KmsNotFound", K::Config, true, false),
            ("ServiceUnavailable", K::Unavailable, true, false),
            ("InternalError", K::Unavailable, true, false),
            ("KMS.KeyUnavailableException", K::Unavailable, true, false),
            ("SomethingNew", K::Publish, true, false),
        ];
        for (code, kind, retryable, per_entry) in table {
            let (k, status, _) = service_status(Some(code), Some(400));
            assert_eq!(
                (
                    k,
                    status == ErrorStatus::Temporary,
                    blames_content(Some(code))
                ),
                (kind, retryable, per_entry),
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
                        .code("AWS.SimpleQueueService.NonExistentQueue")
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
    fn entries_go_through_the_table_then_by_sender_fault() {
        let e = entry_error("q", "InvalidParameterValue", true, Some("bad"));
        match PublishOutcome::of_error(&e) {
            PublishOutcome::Permanent(reason) => {
                assert!(reason.contains("InvalidParameterValue: bad") && reason.contains("q"))
            }
            other => panic!("{other:?}"),
        }
        let e = entry_error("q", "InternalError", false, None);
        assert!(matches!(
            PublishOutcome::of_error(&e),
            PublishOutcome::Retryable(_)
        ));
        // A throttle is retryable whatever SenderFault says.
        for code in [
            "RequestThrottled",
            "KMS.ThrottlingException",
            "KMS.KeyUnavailableException",
        ] {
            let e = entry_error("q", code, true, Some("slow down"));
            assert!(
                matches!(PublishOutcome::of_error(&e), PublishOutcome::Retryable(_)),
                "{code}"
            );
        }
        // A code the table does not know: SenderFault decides.
        assert!(matches!(
            PublishOutcome::of_error(&entry_error("q", "SomethingNew", true, None)),
            PublishOutcome::Permanent(_)
        ));
        assert!(matches!(
            PublishOutcome::of_error(&entry_error("q", "SomethingNew", false, None)),
            PublishOutcome::Retryable(_)
        ));
    }
}
