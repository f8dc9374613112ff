//! [`MessageParts`]: a stored message's fields, for backends decoding rows; its one
//! public path is [`backend::MessageParts`](crate::backend::MessageParts).

use std::time::SystemTime;

use crate::message::{Headers, MessageId};

/// The fields of a stored [`Message`](crate::Message), for backends decoding rows:
/// `Message::from(MessageParts { .. })`.
#[derive(Debug, Clone)]
#[allow(missing_docs)] // the fields are `Message`'s, documented there
pub struct MessageParts {
    pub id: MessageId,
    pub destination: String,
    pub partition_key: Option<String>,
    pub payload: Vec<u8>,
    pub content_type: Option<String>,
    pub headers: Headers,
    pub created_at: SystemTime,
    pub attempts: u32,
    pub last_error: Option<String>,
}
