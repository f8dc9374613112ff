//! Fault injectors: a store, a publisher and the consumer-side stores that fail, stall,
//! panic or crash on cue, for testing how relays and consumers cope.

pub(crate) mod consumer;
pub(crate) mod publisher;
pub(crate) mod store;
