//! The default of [`OutboxStore::settle_and_claim`], for stores that override it in
//! some modes only (re-exported from [`backend`](crate::backend)).

use super::{
    ClaimRequest, Claimed, ClaimedMessage, Lease, OutboxStore, Settled, SettledAndClaimed,
    Settlement,
};
use crate::error::Result;
use crate::message::MessageId;

/// [`OutboxStore::settle_and_claim`]'s default, for a store that overrides it only in
/// some modes: `complete`, `fail` and `release` (skipping empty parts), then `claim`,
/// releasing at once (attempt given back) any claimed message the settlement named.
///
/// # Errors
/// The first settle's error; a failed claim, or a failed release of the named messages
/// it claimed, is reported in [`SettledAndClaimed::claimed`].
pub async fn settle_then_claim<S: OutboxStore + ?Sized>(
    store: &S,
    settlement: Settlement<'_>,
    next: ClaimRequest,
) -> Result<SettledAndClaimed> {
    let completed = settle_part(
        settlement.complete.len(),
        store.complete(settlement.complete),
    );
    let completed = completed.await?;
    let failed = settle_part(settlement.fail.len(), store.fail(settlement.fail)).await?;
    let released = settle_part(settlement.release.len(), store.release(settlement.release));
    let released = released.await?;
    let claimed = match store.claim(next).await {
        Ok(claimed) => exclude_settled(store, claimed, &settlement).await,
        Err(err) => Err(err),
    };
    Ok(SettledAndClaimed {
        completed,
        failed,
        released,
        claimed,
    })
}

/// `claimed` without the messages `settlement` named, which are released at once
/// (attempt given back).
///
/// # Errors
/// The release's error; the claimed leases then lapse as after a crash.
async fn exclude_settled<S: OutboxStore + ?Sized>(
    store: &S,
    claimed: Claimed,
    settlement: &Settlement<'_>,
) -> Result<Claimed> {
    let named: std::collections::HashSet<MessageId> = settlement.ids().collect();
    if !claimed.iter().any(|c| named.contains(&c.message.id)) {
        return Ok(claimed);
    }
    let Claimed {
        messages,
        dead_lettered,
    } = claimed;
    let (again, kept): (Vec<ClaimedMessage>, Vec<ClaimedMessage>) = messages
        .into_iter()
        .partition(|c| named.contains(&c.message.id));
    let leases: Vec<Lease> = again.iter().map(|c| c.lease).collect();
    let _ = store.release(&leases).await?;
    Ok(Claimed::new(kept).with_dead_lettered(dead_lettered))
}

/// One part of a settlement: nothing to do for an empty part.
async fn settle_part(
    count: usize,
    call: impl std::future::Future<Output = Result<Settled>>,
) -> Result<Settled> {
    if count == 0 {
        Ok(Settled::default())
    } else {
        call.await
    }
}
