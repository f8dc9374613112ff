//! Assembling a claim from its committed rows: [`ClaimDecoder`] gathers the decoded rows
//! into a [`DecodedClaim`] in claim order, and [`finish_claim`] turns that into the
//! [`Claimed`] a store returns, dead-lettering the poison rows or giving every row back
//! when they cannot be read at all.

use std::future::Future;
use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::message::Message;
use crate::store::{Claimed, ClaimedMessage, Lease, LeaseToken};

/// A claim's rows, decoded.
#[derive(Debug)]
pub struct DecodedClaim<Id> {
    /// The messages, in claim order (due time, then `seq`).
    pub claimed: Vec<ClaimedMessage>,
    /// Rows that cannot be delivered, by the backend's id, with the reason: to
    /// dead-letter.
    pub poison: Vec<(Id, String)>,
}

/// Builds a [`DecodedClaim`] from a claim's rows, one [`push`](Self::push) per row, in
/// any order.
#[derive(Debug)]
pub struct ClaimDecoder<O, Id> {
    token: LeaseToken,
    claimed: Vec<(O, ClaimedMessage)>,
    poison: Vec<(Id, String)>,
}

impl<O: Ord, Id> ClaimDecoder<O, Id> {
    /// A decoder for the `rows` rows of the claim made with `token`.
    pub fn new(token: LeaseToken, rows: usize) -> Self {
        ClaimDecoder {
            token,
            claimed: Vec::with_capacity(rows),
            poison: Vec::new(),
        }
    }

    /// Add the row `id` at claim position `order` (its due time and `seq`): its checked
    /// message, leased to `expires_at`, or the reason it is poison. `expires_at` is read
    /// only for a message.
    ///
    /// # Errors
    /// The error of `expires_at` (a column of the wrong shape).
    pub fn push(
        &mut self,
        order: O,
        id: Id,
        checked: std::result::Result<Message, String>,
        expires_at: impl FnOnce() -> Result<SystemTime>,
    ) -> Result<()> {
        match checked {
            Ok(message) => {
                let lease = Lease {
                    id: message.id,
                    token: self.token,
                    expires_at: expires_at()?,
                };
                self.claimed
                    .push((order, ClaimedMessage { message, lease }));
            }
            Err(reason) => self.poison.push((id, reason)),
        }
        Ok(())
    }

    /// The decoded claim, its messages sorted into claim order.
    pub fn finish(mut self) -> DecodedClaim<Id> {
        self.claimed.sort_by(|a, b| a.0.cmp(&b.0));
        DecodedClaim {
            claimed: self.claimed.into_iter().map(|(_, c)| c).collect(),
            poison: self.poison,
        }
    }
}

/// What a claim returns once its rows are committed and decoded: the messages, with the
/// poison rows dead-lettered by `dead_letter` (which returns how many it dead-lettered
/// and logs its own failures). When the rows could not be decoded at all, `release`
/// gives the claim back (logging its own failures) and the decode error is returned.
///
/// # Errors
/// The decode error, after `release`.
pub async fn finish_claim<Id, D, DF, R, RF>(
    decoded: Result<DecodedClaim<Id>>,
    dead_letter: D,
    release: R,
) -> Result<Claimed>
where
    D: FnOnce(Vec<(Id, String)>) -> DF,
    DF: Future<Output = usize>,
    R: FnOnce(Error) -> RF,
    RF: Future<Output = Error>,
{
    // The claim has committed: from here on, an error must give its rows back.
    match decoded {
        Ok(DecodedClaim { claimed, poison }) => {
            let dead_lettered = if poison.is_empty() {
                0
            } else {
                dead_letter(poison).await
            };
            Ok(Claimed::new(claimed).with_dead_lettered(dead_lettered))
        }
        Err(err) => Err(release(err).await),
    }
}

/// The ids of a claim whose rows could not be decoded, sorted (so the release locks
/// them in id order), for the backend to give the claim back with. Logs `cause`; when
/// the ids do not decode either, logs that too and returns `None`: the leases then
/// expire as after a crash.
pub fn ids_to_release<R, I: Ord>(
    rows: &[R],
    cause: &Error,
    id: impl Fn(&R) -> Result<I>,
) -> Option<Vec<I>> {
    tracing::error!(
        rows = rows.len(), error = %cause.report(),
        "claimed outbox rows could not be decoded; releasing the claim"
    );
    match rows.iter().map(id).collect::<Result<Vec<I>>>() {
        Ok(mut ids) => {
            ids.sort_unstable();
            Some(ids)
        }
        Err(err) => {
            tracing::error!(
                rows = rows.len(), error = %err.report(),
                "claimed ids do not decode either; the leases expire instead"
            );
            None
        }
    }
}

/// Log that giving back an undecodable claim of `rows` rows failed with `err`: its
/// leases expire instead.
pub fn release_failed(rows: usize, err: &Error) {
    tracing::error!(
        rows, error = %err.report(),
        "could not release the claim; its leases expire instead"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{MessageId, MessageParts};
    use crate::Headers;
    use std::time::UNIX_EPOCH;

    fn message() -> Message {
        Message::from(MessageParts {
            id: MessageId::new(),
            destination: "d".into(),
            partition_key: None,
            payload: Vec::new(),
            content_type: None,
            headers: Headers::new(),
            attempts: 1,
            created_at: UNIX_EPOCH,
            last_error: None,
        })
    }

    #[tokio::test]
    async fn rows_come_out_in_claim_order_and_poison_is_dead_lettered() {
        let token = LeaseToken::new();
        let mut decoder = ClaimDecoder::new(token, 3);
        let (late, early) = (message(), message());
        decoder
            .push(2, 'a', Ok(late.clone()), || Ok(UNIX_EPOCH))
            .unwrap();
        decoder
            .push(9, 'b', Err("bad".into()), || unreachable!())
            .unwrap();
        decoder
            .push(1, 'c', Ok(early.clone()), || Ok(UNIX_EPOCH))
            .unwrap();
        let decoded = decoder.finish();
        let ids: Vec<_> = decoded.claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(ids, [early.id, late.id]);
        assert_eq!(decoded.claimed[0].lease.token, token);
        let claimed = finish_claim(
            Ok(decoded),
            |poison| async move { poison.len() },
            |err| async { err },
        )
        .await
        .unwrap();
        assert_eq!((claimed.len(), claimed.dead_lettered), (2, 1));
        let err = finish_claim::<char, _, _, _, _>(
            Err(Error::invalid_input("shape")),
            |_| async { unreachable!() },
            |err| async { err },
        )
        .await
        .unwrap_err();
        assert_eq!(err.message(), "shape");
    }
}
