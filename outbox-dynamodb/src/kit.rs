//! Building blocks for crates that keep their own items in DynamoDB beside this one
//! (`outbox-dynamodb-streams` is one): creating and checking tables, mapping SDK errors
//! the way this crate does, item sizes and the split of large payloads. A service
//! using the outbox needs none of it.

pub use crate::enqueue::{enqueue_error, send_enqueue};
pub use crate::error::{build_error, from_sdk, is_condition_failed};
pub use crate::item::{body_parts, item_size, Item, PART_BYTES};
pub use crate::item::{from_micros, micros, now_us};
pub use crate::metrics::CapacityCounter;
pub use crate::schema::{drop_table, install as install_table, TableSpec};
