//! What only DynamoDB can get wrong: conditional-write races, TTL-expired items still
//! present, the item and transaction limits, crashes between the conditional writes, and
//! per-key order across shards.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-dynamodb --test dynamodb`

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod bodies;
mod dedup;
mod faults;
mod limits;
mod lock;
mod markers;
mod relay;
mod settle;
mod shard_count;
mod shards;
mod store;
mod sweep;
