//! The clock and the stored form of times: integers of microseconds since the Unix
//! epoch.
//!
//! SQLite has no clock of its own worth using (its `unixepoch('subsec')` has
//! millisecond resolution), and every process sharing a database file runs on the same
//! host, so the statements bind the host's clock, read once per statement.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in microseconds since the Unix epoch (negative before it, saturating).
pub(crate) fn now_us() -> i64 {
    to_us(SystemTime::now())
}

/// `time` in microseconds since the Unix epoch, saturating at the `i64` range.
pub(crate) fn to_us(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |us| -us),
    }
}

/// The time `us` microseconds from the Unix epoch, if the platform can hold it.
pub(crate) fn from_us(us: i64) -> Option<SystemTime> {
    let magnitude = Duration::from_micros(us.unsigned_abs());
    if us >= 0 {
        UNIX_EPOCH.checked_add(magnitude)
    } else {
        UNIX_EPOCH.checked_sub(magnitude)
    }
}

// Bound-parameter conversions shared by every backend.
pub(crate) use outbox_core::backend::{age_micros, limit_param, micros};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_through_microseconds() {
        for us in [0, 1, -1, 1_700_000_000_123_456, -62_135_596_800_000_000] {
            assert_eq!(to_us(from_us(us).unwrap()), us, "{us}");
        }
        let now = SystemTime::now();
        let back = from_us(to_us(now)).unwrap();
        assert!(now.duration_since(back).unwrap() < Duration::from_micros(1));
        assert!(now_us() > 1_700_000_000_000_000);
    }
}
