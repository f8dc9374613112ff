//! Lease renewal: a relay whose publish outlasts its lease extends it instead of
//! letting the message be claimed and published twice.
//!
//! A renewal is the claim's write without the claim: one `UpdateItem` of the state
//! item per lease, fenced like the settles (`token = :token AND attribute_exists(due)`),
//! that moves the availability and the `due` index entry to the new expiry and keeps
//! the token and the attempts. It costs what a claim write costs (the state item and
//! the `due` entry moved: 3 write units under 1 KB) and never the payload, except when
//! the body would have less than half of `body_ttl` left past the new expiry: then it
//! is renewed too, as a claim would. The expiry comes from this process's clock, as a
//! claim's does.

use outbox_core::backend::{in_id_order, validate_lease};
use outbox_core::{store::Lease, store::Renewed, MessageId, Result};
use std::time::Duration;

use crate::concurrency::bounded_all;
use crate::item::{self, n, now_us, AVAILABLE, DUE, DUE_SCALE, SEQ};
use crate::settle::all_settled;
use crate::store::DynamoOutbox;

impl DynamoOutbox {
    /// Extend `leases` to `lease` from now (see the module docs); the ones whose token
    /// is no longer the message's are reported lost and not changed.
    pub(crate) async fn renew_leases(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        if leases.is_empty() {
            return Ok(Renewed::default());
        }
        let expires = now_us().saturating_add(item::duration_us(lease));
        let ordered = in_id_order(leases, |l| l.id);
        let outcomes = bounded_all(
            ordered
                .iter()
                .map(|l| self.renew_message_lease(l, expires))
                .collect(),
        )
        .await;
        let renewed: Vec<Option<MessageId>> = all_settled(&self.inner.metrics, outcomes)?;
        let at = item::from_micros(expires);
        Ok(Renewed::reconcile(
            leases,
            renewed.into_iter().flatten().map(|id| (id, at)),
        ))
    }

    /// Renew one lease to `expires_us`; its id when the fence held.
    async fn renew_message_lease(
        &self,
        lease: &Lease,
        expires_us: u64,
    ) -> Result<Option<MessageId>> {
        let update = format!("SET #{AVAILABLE} = :exp, #{DUE} = :base + #{SEQ}");
        let values = vec![
            (":exp", n(expires_us)),
            (":base", n(u128::from(expires_us) * DUE_SCALE)),
        ];
        let renewed = self
            .fenced_update(
                "renew lease",
                lease,
                update,
                values,
                "",
                aws_sdk_dynamodb::types::ReturnValue::AllNew,
            )
            .await?;
        let Some(state) = renewed else {
            return Ok(None);
        };
        self.keep_state_body_ahead(lease.id, &state, expires_us)
            .await;
        Ok(Some(lease.id))
    }
}
