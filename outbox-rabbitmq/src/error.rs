//! The one place where lapin's errors and AMQP reply codes become
//! [`outbox_core::Error`]s and [`PublishOutcome`]s.

use std::time::Duration;

use lapin::protocol::AMQPError;
use outbox_core::{Error, ErrorKind, ErrorStatus, PublishOutcome};

/// What an AMQP 0-9-1 reply code (a `channel.close`, `connection.close` or
/// `basic.return` reason) means for the publisher: the error kind and whether trying
/// again can help.
///
/// Codes are the constants of the AMQP 0-9-1 specification, which RabbitMQ uses
/// unchanged (<https://www.rabbitmq.com/amqp-0-9-1-reference#constants>).
pub(crate) fn reply_code(code: u16) -> (ErrorKind, ErrorStatus) {
    use ErrorKind::{Config, Contention, Publish, Unavailable};
    use ErrorStatus::{Permanent, Temporary};
    match code {
        // content-too-large: the message is over a limit of the broker.
        311 => (Publish, Permanent),
        // no-route (a mandatory message no queue is bound for) and no-consumers.
        312 | 313 => (Publish, Permanent),
        // connection-forced: an operator or a shutting-down node closed the connection.
        320 => (Unavailable, Temporary),
        // invalid-path: the vhost does not exist.
        402 => (Config, Permanent),
        // access-refused: bad credentials, or no permission on the vhost or exchange.
        403 => (Config, Permanent),
        // not-found: the exchange does not exist.
        404 => (Publish, Permanent),
        // resource-locked: an exclusive queue of another connection.
        405 => (Contention, Temporary),
        // precondition-failed: the broker refused the message as sent (over its
        // max_message_size, an invalid property).
        406 => (Publish, Permanent),
        // frame-error, syntax-error, command-invalid, unexpected-frame, not-implemented:
        // the client spoke the protocol wrong; sending the same frames again fails
        // again.
        501 | 502 | 503 | 505 | 540 => (Publish, Permanent),
        // channel-error (a channel the broker no longer knows), resource-error (the
        // node is out of a resource), internal-error.
        504 | 506 | 541 => (Unavailable, Temporary),
        // not-allowed: the user may not open the vhost.
        530 => (Config, Permanent),
        _ => (Publish, Temporary),
    }
}

/// An AMQP error the broker sent, by [`reply_code`].
fn amqp(doing: &str, error: &AMQPError) -> Error {
    let code = error.get_id();
    let (kind, status) = reply_code(code);
    Error::new(
        kind,
        format!("{doing}: the broker replied {code} {}", error.get_message()),
    )
    .with_status(status)
}

/// `error`, met while `doing` something, as the workspace's error.
pub(crate) fn from_lapin(doing: &str, error: lapin::Error) -> Error {
    use lapin::ErrorKind as L;
    let mapped = match error.kind() {
        L::ProtocolError(amqp_error) => amqp(doing, amqp_error),
        L::IOError(_) | L::RuntimeShutdownError(_) | L::MissingHeartbeatError => {
            Error::new(ErrorKind::Unavailable, format!("{doing}: connection lost"))
        }
        L::InvalidConnectionState(_) | L::InvalidChannelState(..) | L::InvalidChannel(_) => {
            Error::new(
                ErrorKind::Unavailable,
                format!("{doing}: the connection or channel is closed"),
            )
        }
        L::ChannelsLimitReached => Error::new(
            ErrorKind::Unavailable,
            format!("{doing}: no channel left on the connection"),
        ),
        L::ParsingError(_) => Error::new(
            ErrorKind::Unavailable,
            format!("{doing}: undecodable frame from the broker"),
        ),
        L::SerialisationError(_) => Error::new(
            ErrorKind::Publish,
            format!("{doing}: the message cannot be encoded as an AMQP frame"),
        )
        .with_status(ErrorStatus::Permanent),
        L::AuthProviderError(_) | L::InvalidProtocolVersion(_) | L::NoDefaultRuntime => {
            Error::config(format!("{doing}: cannot connect with these settings"))
        }
        _ => Error::new(ErrorKind::Unavailable, format!("{doing}: client error")),
    };
    mapped.with_source(error)
}

/// Whether the broker answered `error` with 404 NOT_FOUND (a missing exchange).
pub(crate) fn is_not_found(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(e) if e.get_id() == 404)
}

/// A wait that ran out.
pub(crate) fn timeout(doing: &str, after: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("{doing}: timed out after {after:?}"),
    )
}

/// The outcome for a message that `error` is about: the broker said something of this
/// very message (a `basic.return`, a frame that cannot be encoded).
pub(crate) fn outcome_of(error: &Error) -> PublishOutcome {
    if error.is_retryable() {
        PublishOutcome::Retryable(error.report().to_string())
    } else {
        PublishOutcome::Permanent(error.report().to_string())
    }
}

/// The outcome for a message caught up in a connection or channel failure: the message
/// is not at fault whatever the code, so it is retried once the publisher reconnects.
pub(crate) fn outcome_of_failure(error: &Error) -> PublishOutcome {
    PublishOutcome::Retryable(error.report().to_string())
}

/// The outcome for a message the broker returned (`basic.return`, in practice
/// 312 NO_ROUTE: no queue is bound for its routing key).
pub(crate) fn returned(code: u16, text: &str, exchange: &str, routing_key: &str) -> PublishOutcome {
    let (kind, status) = reply_code(code);
    let exchange = if exchange.is_empty() {
        "the default exchange"
    } else {
        exchange
    };
    let error = Error::new(
        kind,
        format!("returned by the broker: {code} {text} (exchange {exchange:?}, routing key {routing_key:?})"),
    )
    .with_status(status);
    outcome_of(&error)
}

#[cfg(test)]
mod tests {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

    use super::*;

    /// Every reply code of the AMQP 0-9-1 specification, with the name the
    /// specification gives it and what the publisher makes of it.
    const TABLE: &[(u16, &str, ErrorKind, ErrorStatus)] = &[
        (
            311,
            "content-too-large",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (312, "no-route", ErrorKind::Publish, ErrorStatus::Permanent),
        (
            313,
            "no-consumers",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            320,
            "connection-forced",
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
        ),
        (
            402,
            "invalid-path",
            ErrorKind::Config,
            ErrorStatus::Permanent,
        ),
        (
            403,
            "access-refused",
            ErrorKind::Config,
            ErrorStatus::Permanent,
        ),
        (404, "not-found", ErrorKind::Publish, ErrorStatus::Permanent),
        (
            405,
            "resource-locked",
            ErrorKind::Contention,
            ErrorStatus::Temporary,
        ),
        (
            406,
            "precondition-failed",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            501,
            "frame-error",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            502,
            "syntax-error",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            503,
            "command-invalid",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            504,
            "channel-error",
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
        ),
        (
            505,
            "unexpected-frame",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            506,
            "resource-error",
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
        ),
        (
            530,
            "not-allowed",
            ErrorKind::Config,
            ErrorStatus::Permanent,
        ),
        (
            540,
            "not-implemented",
            ErrorKind::Publish,
            ErrorStatus::Permanent,
        ),
        (
            541,
            "internal-error",
            ErrorKind::Unavailable,
            ErrorStatus::Temporary,
        ),
    ];

    #[test]
    fn reply_codes_follow_the_table() {
        for &(code, name, kind, status) in TABLE {
            assert_eq!(reply_code(code), (kind, status), "{code} {name}");
        }
        assert_eq!(
            reply_code(999),
            (ErrorKind::Publish, ErrorStatus::Temporary),
            "unknown codes are retried"
        );
    }

    #[test]
    fn the_table_uses_the_codes_lapin_decodes() {
        // The protocol crate generates its constants from the specification's XML:
        // every code it knows is in the table under the specification's name.
        for &(code, name, ..) in TABLE {
            let error = AMQPError::from_id(code, "x".into())
                .unwrap_or_else(|| panic!("{code} {name} unknown to amq-protocol"));
            let spelled = match error.kind() {
                AMQPErrorKind::Soft(soft) => format!("{soft:?}"),
                AMQPErrorKind::Hard(hard) => format!("{hard:?}"),
            };
            assert_eq!(spelled, name.replace('-', "").to_uppercase(), "{code}");
        }
        assert_eq!(AMQPSoftError::NOROUTE.get_id(), 312);
        assert_eq!(AMQPHardError::CONNECTIONFORCED.get_id(), 320);
    }

    #[test]
    fn lapin_errors_map_by_kind() {
        let lost = lapin::Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let err = from_lapin("publishing", lost);
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.is_retryable());
        assert!(std::error::Error::source(&err).is_some(), "cause kept");

        let refused = lapin::Error::from(lapin::ErrorKind::ProtocolError(AMQPError::new(
            AMQPSoftError::ACCESSREFUSED.into(),
            "ACCESS_REFUSED - Login was refused".into(),
        )));
        let err = from_lapin("connecting", refused);
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("403"), "{err}");

        let forced = lapin::Error::from(lapin::ErrorKind::ProtocolError(AMQPError::new(
            AMQPHardError::CONNECTIONFORCED.into(),
            "CONNECTION_FORCED - closed via management plugin".into(),
        )));
        assert!(from_lapin("publishing", forced).is_retryable());
    }

    #[test]
    fn failures_are_retryable_whatever_the_code() {
        let not_found = Error::new(ErrorKind::Publish, "404").with_status(ErrorStatus::Permanent);
        assert!(matches!(
            outcome_of(&not_found),
            PublishOutcome::Permanent(_)
        ));
        assert!(matches!(
            outcome_of_failure(&not_found),
            PublishOutcome::Retryable(_)
        ));
    }

    #[test]
    fn returned_messages_are_permanent_and_say_where_they_went() {
        let PublishOutcome::Permanent(reason) = returned(312, "NO_ROUTE", "", "orders") else {
            panic!("NO_ROUTE must be permanent");
        };
        assert!(reason.contains("312 NO_ROUTE"), "{reason}");
        assert!(reason.contains("the default exchange"), "{reason}");
        assert!(reason.contains("\"orders\""), "{reason}");
    }
}
