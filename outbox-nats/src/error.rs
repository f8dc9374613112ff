//! The one place where async-nats errors become [`outbox_core::Error`]s.
//!
//! | async-nats | kind | status |
//! |---|---|---|
//! | publish `StreamNotFound` (no responders, 503), and JetStream answers that no stream stores the subject | `Publish` | permanent |
//! | publish `StreamNotFound`, and JetStream does not answer (restarting, not ready) or a stream appeared meanwhile | `Unavailable` | temporary |
//! | publish `MaxPayloadExceeded` (over the server's `max_payload`) | `Publish` | permanent |
//! | publish `TimedOut` (no `PubAck` within the ack timeout) | `Timeout` | temporary |
//! | publish `BrokenPipe` (the connection dropped before the ack) | `Unavailable` | temporary |
//! | publish `MaxAckPending` | `Publish` | temporary |
//! | publish `WrongLastMessageId` / `WrongLastSequence` (10070, 10071) | `Conflict` | permanent |
//! | JetStream 10054 (message over the stream's `max_msg_size`), 10097 (headers over maximum), 10109 (sealed stream), 10039 / 10076 (JetStream not enabled) | `Publish` | permanent |
//! | JetStream 10077 (store failed: a full stream with discard `new`), 10023 / 10028 / 10047 / 10002 (resources exceeded), 10008 (temporarily unavailable), any code with status 503 | `Unavailable` | temporary |
//! | any other JetStream error | `Publish` | temporary |
//! | publish `Other` without a JetStream error (the client's command channel closed) | `Unavailable` | temporary |
//! | connect `ServerParse`, `Tls` | `Config` | permanent |
//! | connect `Authentication`, `AuthorizationViolation` | `Config` | permanent |
//! | connect `Dns`, `Io`, `TimedOut`, `MaxReconnects` | `Unavailable` | temporary |
//!
//! Codes are JetStream's `err_code`s (nats-server `errors.json`, as async-nats's
//! [`ErrorCode`] constants name them).

use async_nats::jetstream::context::{
    GetStreamByNameError, GetStreamByNameErrorKind, PublishError, PublishErrorKind,
};
use async_nats::jetstream::ErrorCode;
use async_nats::{ConnectError, ConnectErrorKind};
use outbox_core::{Error, ErrorKind, ErrorStatus};

/// What a failed publish of one message to `subject` means.
pub(crate) fn publish_error(subject: &str, err: PublishError) -> Error {
    let (kind, status, what) = match err.kind() {
        PublishErrorKind::StreamNotFound => (
            ErrorKind::Publish,
            ErrorStatus::Permanent,
            "no JetStream stream stores the subject (no responders)",
        ),
        PublishErrorKind::MaxPayloadExceeded => (
            ErrorKind::Publish,
            ErrorStatus::Permanent,
            "the message is over the server's max_payload",
        ),
        PublishErrorKind::TimedOut => (
            ErrorKind::Timeout,
            ErrorStatus::Temporary,
            "no PubAck within the ack timeout",
        ),
        PublishErrorKind::BrokenPipe => (
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
            "the connection dropped before the PubAck arrived",
        ),
        PublishErrorKind::MaxAckPending => (
            ErrorKind::Publish,
            ErrorStatus::Temporary,
            "too many PubAcks outstanding",
        ),
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => (
            ErrorKind::Conflict,
            ErrorStatus::Permanent,
            "the stream refused an expectation header",
        ),
        PublishErrorKind::Other => match jetstream_error(&err) {
            Some(js) => jetstream_status(js),
            None => (
                ErrorKind::Unavailable,
                ErrorStatus::Temporary,
                "the client could not send the message",
            ),
        },
    };
    Error::new(kind, format!("publish to {subject:?} failed: {what}"))
        .with_status(status)
        .with_source(err)
}

/// The JetStream API error behind a publish error, if the server sent one.
fn jetstream_error(err: &PublishError) -> Option<&async_nats::jetstream::Error> {
    std::error::Error::source(err)?.downcast_ref::<async_nats::jetstream::Error>()
}

fn jetstream_status(js: &async_nats::jetstream::Error) -> (ErrorKind, ErrorStatus, &'static str) {
    match js.error_code() {
        ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM => (
            ErrorKind::Publish,
            ErrorStatus::Permanent,
            "the message is over the stream's size limit",
        ),
        ErrorCode::STREAM_SEALED => (
            ErrorKind::Publish,
            ErrorStatus::Permanent,
            "the stream is sealed",
        ),
        ErrorCode::JETSTREAM_NOT_ENABLED | ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT => (
            ErrorKind::Publish,
            ErrorStatus::Permanent,
            "JetStream is not enabled",
        ),
        ErrorCode::STREAM_STORE_FAILED
        | ErrorCode::INSUFFICIENT_RESOURCES
        | ErrorCode::MEMORY_RESOURCES_EXCEEDED
        | ErrorCode::STORAGE_RESOURCES_EXCEEDED
        | ErrorCode::ACCOUNT_RESOURCES_EXCEEDED
        | ErrorCode::CLUSTER_NOT_AVAILABLE => (
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
            "the stream cannot store the message now",
        ),
        _ if js.code() == 503 => (
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
            "JetStream is unavailable",
        ),
        _ => (
            ErrorKind::Publish,
            ErrorStatus::Temporary,
            "JetStream refused the message",
        ),
    }
}

/// Settle a `StreamNotFound` (no responders) by what JetStream says about the subject:
/// permanent only when JetStream answers and no stream stores it. No responders also
/// come back while JetStream restarts or recovers its streams; that is retryable.
pub(crate) fn no_stream(
    subject: &str,
    publish: Error,
    probe: std::result::Result<String, GetStreamByNameError>,
) -> Error {
    match probe {
        Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => publish,
        Ok(stream) => Error::new(
            ErrorKind::Unavailable,
            format!(
                "publish to {subject:?} found no responders, but stream {stream:?} stores the \
                 subject now"
            ),
        )
        .with_source(publish),
        Err(probe) => Error::new(
            ErrorKind::Unavailable,
            format!(
                "publish to {subject:?} found no responders and JetStream did not say which \
                 stream stores it ({probe}); it may be restarting"
            ),
        )
        .with_source(publish),
    }
}

/// What a failed first connection means.
pub(crate) fn connect_error(err: ConnectError) -> Error {
    let (kind, what) = match err.kind() {
        ConnectErrorKind::ServerParse => (ErrorKind::Config, "the server address does not parse"),
        ConnectErrorKind::Tls => (ErrorKind::Config, "the TLS setup failed"),
        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
            (ErrorKind::Config, "the server refused the credentials")
        }
        ConnectErrorKind::Dns
        | ConnectErrorKind::Io
        | ConnectErrorKind::TimedOut
        | ConnectErrorKind::MaxReconnects => (ErrorKind::Unavailable, "the server is unreachable"),
    };
    Error::new(kind, format!("connecting to NATS failed: {what}")).with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::PublishOutcome;

    fn js(code: usize, err_code: u64) -> async_nats::jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code, "err_code": err_code, "description": "from the server"
        }))
        .unwrap()
    }

    fn mapped(err: PublishError) -> (ErrorKind, bool) {
        let e = publish_error("s", err);
        (e.kind(), e.is_retryable())
    }

    #[test]
    fn publish_errors_map_by_kind() {
        use PublishErrorKind as K;
        let table = [
            (K::StreamNotFound, ErrorKind::Publish, false),
            (K::MaxPayloadExceeded, ErrorKind::Publish, false),
            (K::TimedOut, ErrorKind::Timeout, true),
            (K::BrokenPipe, ErrorKind::Unavailable, true),
            (K::MaxAckPending, ErrorKind::Publish, true),
            (K::WrongLastMessageId, ErrorKind::Conflict, false),
            (K::WrongLastSequence, ErrorKind::Conflict, false),
            (K::Other, ErrorKind::Unavailable, true),
        ];
        for (kind, expected, retryable) in table {
            assert_eq!(
                mapped(PublishError::new(kind)),
                (expected, retryable),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn jetstream_codes_map_by_code() {
        let table = [
            (400, 10054, ErrorKind::Publish, false),
            (400, 10097, ErrorKind::Publish, false),
            (400, 10109, ErrorKind::Publish, false),
            (503, 10076, ErrorKind::Publish, false),
            (503, 10039, ErrorKind::Publish, false),
            (503, 10077, ErrorKind::Unavailable, true),
            (400, 10023, ErrorKind::Unavailable, true),
            (500, 10028, ErrorKind::Unavailable, true),
            (500, 10047, ErrorKind::Unavailable, true),
            (400, 10002, ErrorKind::Unavailable, true),
            (503, 10008, ErrorKind::Unavailable, true),
            (503, 99999, ErrorKind::Unavailable, true),
            (400, 99999, ErrorKind::Publish, true),
        ];
        for (code, err_code, expected, retryable) in table {
            let err = PublishError::with_source(PublishErrorKind::Other, js(code, err_code));
            assert_eq!(mapped(err), (expected, retryable), "{code}/{err_code}");
        }
    }

    #[test]
    fn no_responders_are_permanent_only_when_jetstream_says_no_stream() {
        let publish = || publish_error("s", PublishError::new(PublishErrorKind::StreamNotFound));
        let none = no_stream(
            "s",
            publish(),
            Err(GetStreamByNameError::new(
                GetStreamByNameErrorKind::NotFound,
            )),
        );
        assert_eq!(
            (none.kind(), none.is_retryable()),
            (ErrorKind::Publish, false)
        );
        let silent = no_stream(
            "s",
            publish(),
            Err(GetStreamByNameError::new(GetStreamByNameErrorKind::Request)),
        );
        assert_eq!(
            (silent.kind(), silent.is_retryable()),
            (ErrorKind::Unavailable, true)
        );
        let appeared = no_stream("s", publish(), Ok("S".into()));
        assert!(appeared.is_retryable());
    }

    #[test]
    fn connect_errors_map_by_kind() {
        use ConnectErrorKind as K;
        for (kind, expected) in [
            (K::ServerParse, ErrorKind::Config),
            (K::Tls, ErrorKind::Config),
            (K::Authentication, ErrorKind::Config),
            (K::AuthorizationViolation, ErrorKind::Config),
            (K::Dns, ErrorKind::Unavailable),
            (K::Io, ErrorKind::Unavailable),
            (K::TimedOut, ErrorKind::Unavailable),
            (K::MaxReconnects, ErrorKind::Unavailable),
        ] {
            assert_eq!(
                connect_error(ConnectError::new(kind)).kind(),
                expected,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn outcomes_follow_the_status_and_print_the_cause_once() {
        let err = publish_error("a.b", PublishError::new(PublishErrorKind::TimedOut));
        match PublishOutcome::of_error(&err) {
            PublishOutcome::Retryable(reason) => {
                assert!(
                    reason.contains("a.b") && reason.contains("PubAck"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        let err = publish_error(
            "a.b",
            PublishError::new(PublishErrorKind::MaxPayloadExceeded),
        );
        assert!(matches!(
            PublishOutcome::of_error(&err),
            PublishOutcome::Permanent(_)
        ));
    }
}
