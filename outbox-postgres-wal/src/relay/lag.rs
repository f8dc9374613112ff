//! The lag gauges ([`SLOT_LAG_BYTES`](crate::SLOT_LAG_BYTES),
//! [`SLOT_LAG_SECONDS`](crate::SLOT_LAG_SECONDS)): the lag ticks, and what each slot
//! read does, for a standby waiting for the lock, in a session, and while a publish is
//! in flight.

use std::time::{Duration, SystemTime};

use outbox_core::Result;

use super::WalRelay;

/// A lag interval that skips the ticks it missed (a long publish or a slow check must
/// not be followed by a burst of slot checks).
pub(super) fn lag_ticks(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    ticks
}

impl WalRelay {
    /// A standby's read, between attempts at the lock: the bytes gauge only, and a
    /// failed read is skipped.
    pub(super) async fn standby_lag(&self) {
        if let Ok(Some(status)) = self.outbox.slot_status().await {
            self.meters.lag_bytes(status.lag_bytes);
        }
    }

    /// A session's lag tick: check the slot and set both gauges, `oldest` being the
    /// commit time of the oldest message waiting.
    ///
    /// # Errors
    /// The slot's check: an invalidated or missing slot stops the relay.
    pub(super) async fn session_lag(&self, oldest: Option<SystemTime>) -> Result<()> {
        let status = self.outbox.check_slot().await?;
        self.meters.lag(status.lag_bytes, oldest);
        Ok(())
    }

    /// A lag tick while a publish is in flight, bounded by one lag interval. A failed
    /// check is only logged: the publish goes on (what it carries was read before the
    /// loss), and the session's own check stops the relay once it ends.
    pub(super) async fn publish_lag(&self, oldest: Option<SystemTime>) {
        match tokio::time::timeout(self.config.lag_interval, self.outbox.check_slot()).await {
            Ok(Ok(status)) => self.meters.lag(status.lag_bytes, oldest),
            Ok(Err(e)) if !e.is_retryable() => {
                tracing::warn!(error = %e.report(), "wal relay: the slot failed its check during a publish; stopping once the publish ends")
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e.report(), "wal relay: slot check during a publish")
            }
            Err(_) => tracing::debug!("wal relay: slot check during a publish timed out"),
        }
    }
}
