//! The messages the benches send, and a new message as a relay is handed it.

use std::time::SystemTime;

use outbox_core::backend::MessageParts;
use outbox_core::{Message, NewMessage};

/// The destination of [`order_message`].
pub const ORDER_DESTINATION: &str = "orders.created";

/// `m` as a store returns it from a claim: the same id, destination, key, payload,
/// content type and headers, created now, on its first attempt. For publishing
/// without a database (a publisher alone, at a relay's batch size).
pub fn stored(m: &NewMessage) -> Message {
    Message::from(MessageParts {
        id: m.id(),
        destination: m.destination().to_owned(),
        partition_key: m.partition_key().map(str::to_owned),
        payload: m.payload().to_vec(),
        content_type: m.content_type().map(str::to_owned),
        headers: m.headers().clone(),
        created_at: SystemTime::now(),
        attempts: 1,
        last_error: None,
    })
}

/// The JSON body of [`order_message`]: an order event of about 120 bytes.
pub fn order_json(i: u64) -> serde_json::Value {
    serde_json::json!({
        "order_id": i,
        "customer": format!("customer-{:06}", i % 100_000),
        "amount_cents": 1_000 + i % 9_000,
        "currency": "EUR",
        "note": "benchmark payload, roughly the size of a small domain event",
    })
}

/// Order `i` as a message to [`ORDER_DESTINATION`], `application/json`: what the
/// PostgreSQL and broker benches send.
pub fn order_message(i: u64) -> outbox_core::Result<NewMessage> {
    NewMessage::builder(ORDER_DESTINATION)
        .content_type("application/json")
        .payload(order_json(i).to_string().into_bytes())
        .build()
}
