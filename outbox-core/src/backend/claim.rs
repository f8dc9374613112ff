//! Assembling a claim from its committed rows: [`ClaimDecoder`] gathers the decoded rows
//! into a [`DecodedClaim`] in claim order, and [`finish_claim`] turns that into the
//! [`Claimed`] a store returns through the backend's [`CommittedClaim`], dead-lettering
//! the poison rows or giving every row back when they cannot be read at all.

use std::fmt;
use std::future::Future;
use std::time::SystemTime;

use crate::bounds::bounded_error;
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

impl<Id> DecodedClaim<Id> {
    /// The same claim with its poison rows named by `id(row id)`.
    pub fn map_ids<T>(self, id: impl Fn(Id) -> T) -> DecodedClaim<T> {
        DecodedClaim {
            claimed: self.claimed,
            poison: self
                .poison
                .into_iter()
                .map(|(row, why)| (id(row), why))
                .collect(),
        }
    }
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

/// A backend's side of a committed claim, for [`finish_claim`]: how its rows decode,
/// and the two fenced writes that follow when some or all of them cannot be delivered.
/// Both writes run after the claim committed, outside its transaction; their failures
/// are logged by [`finish_claim`], never returned, because the leases then expire as
/// after a crash and a later claim tries the rows again.
pub trait CommittedClaim: Sync {
    /// A claimed row as the driver returns it.
    type Row: Send + Sync;
    /// The backend's row id, bound in id order.
    type Id: Ord + Send + fmt::Debug;

    /// The claim's rows, decoded with a [`ClaimDecoder`].
    ///
    /// # Errors
    /// A row whose shape does not decode at all (a column of the wrong type): the whole
    /// claim is then given back.
    fn decode(&self, token: LeaseToken, rows: &[Self::Row]) -> Result<DecodedClaim<Self::Id>>;

    /// The id of `row`, to give an undecodable claim back by primary key.
    ///
    /// # Errors
    /// The id column does not decode either.
    fn row_id(row: &Self::Row) -> Result<Self::Id>;

    /// Dead-letter `rows` (sorted by id, reasons bounded to `MAX_ERROR_LEN`), fenced by
    /// `token`; how many were.
    fn dead_letter_rows(
        &self,
        token: LeaseToken,
        rows: Vec<(Self::Id, String)>,
    ) -> impl Future<Output = Result<usize>> + Send;

    /// Release the rows `ids` (sorted), fenced by `token`, with their attempt given back,
    /// so the messages are due again at once.
    fn release_rows(
        &self,
        token: LeaseToken,
        ids: Vec<Self::Id>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// What a claim made with `token` returns once its `rows` are committed: the messages,
/// with the poison rows dead-lettered. When the rows cannot be decoded at all, the whole
/// claim is given back and the decode error returned.
///
/// # Errors
/// The decode error, after the release.
pub async fn finish_claim<B: CommittedClaim>(
    backend: &B,
    token: LeaseToken,
    rows: Vec<B::Row>,
) -> Result<Claimed> {
    // The claim has committed: from here on, an error must give its rows back.
    let DecodedClaim { claimed, poison } = match backend.decode(token, &rows) {
        Ok(decoded) => decoded,
        Err(err) => {
            release_claim(backend, token, &rows, &err).await;
            return Err(err);
        }
    };
    let dead_lettered = if poison.is_empty() {
        0
    } else {
        dead_letter(backend, token, poison).await
    };
    Ok(Claimed::new(claimed).with_dead_lettered(dead_lettered))
}

/// Dead-letter the poison rows of a claim; how many were (none when the write failed).
async fn dead_letter<B: CommittedClaim>(
    backend: &B,
    token: LeaseToken,
    mut poison: Vec<(B::Id, String)>,
) -> usize {
    poison.sort_by(|a, b| a.0.cmp(&b.0));
    let poison: Vec<(B::Id, String)> = poison
        .into_iter()
        .map(|(id, reason)| (id, bounded_error(reason)))
        .collect();
    tracing::warn!(
        ?poison,
        "dead-lettering claimed outbox rows that cannot be delivered"
    );
    match backend.dead_letter_rows(token, poison).await {
        Ok(done) => done,
        Err(err) => {
            tracing::error!(error = %err.report(), "could not dead-letter claimed rows");
            0
        }
    }
}

/// Give back the committed rows of a claim that cannot be returned (`cause`: they do
/// not decode, or a later statement of the claim failed), found by primary key and
/// fenced by `token`. Logs `cause`; when the ids do not decode either, or the release
/// fails, logs that too: the leases then expire as after a crash.
pub async fn release_claim<B: CommittedClaim>(
    backend: &B,
    token: LeaseToken,
    rows: &[B::Row],
    cause: &Error,
) {
    tracing::error!(
        rows = rows.len(), error = %cause.report(),
        "a committed claim cannot be returned; releasing its rows"
    );
    let mut ids = match rows.iter().map(B::row_id).collect::<Result<Vec<_>>>() {
        Ok(ids) => ids,
        Err(err) => {
            tracing::error!(
                rows = rows.len(), error = %err.report(),
                "claimed ids do not decode either; the leases expire instead"
            );
            return;
        }
    };
    ids.sort_unstable();
    if let Err(err) = backend.release_rows(token, ids).await {
        tracing::error!(
            rows = rows.len(), error = %err.report(),
            "could not release the claim; its leases expire instead"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageId;
    use crate::message_parts::MessageParts;
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

    /// A backend whose rows are `(id, message or poison reason)`, recording the fenced
    /// writes `finish_claim` makes.
    #[derive(Default)]
    struct Rows {
        shape_error: bool,
        write_fails: bool,
        dead: std::sync::Mutex<Vec<(LeaseToken, Poison)>>,
        released: std::sync::Mutex<Vec<(LeaseToken, Vec<i32>)>>,
    }

    type Row = (i32, std::result::Result<Message, String>);
    type Poison = Vec<(i32, String)>;

    impl CommittedClaim for Rows {
        type Row = Row;
        type Id = i32;

        fn decode(&self, token: LeaseToken, rows: &[Row]) -> Result<DecodedClaim<i32>> {
            if self.shape_error {
                return Err(Error::invalid_input("shape"));
            }
            let mut decoder = ClaimDecoder::new(token, rows.len());
            for (id, checked) in rows {
                decoder.push(-id, *id, checked.clone(), || Ok(UNIX_EPOCH))?;
            }
            Ok(decoder.finish())
        }

        fn row_id(row: &Row) -> Result<i32> {
            if row.0 < 0 {
                return Err(Error::invalid_input("id"));
            }
            Ok(row.0)
        }

        async fn dead_letter_rows(
            &self,
            token: LeaseToken,
            rows: Vec<(i32, String)>,
        ) -> Result<usize> {
            let n = rows.len();
            self.dead.lock().unwrap().push((token, rows));
            if self.write_fails {
                return Err(Error::invalid_input("write"));
            }
            Ok(n)
        }

        async fn release_rows(&self, token: LeaseToken, ids: Vec<i32>) -> Result<()> {
            self.released.lock().unwrap().push((token, ids));
            if self.write_fails {
                return Err(Error::invalid_input("write"));
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn rows_come_out_in_claim_order_and_poison_is_dead_lettered_in_id_order() {
        let token = LeaseToken::new();
        let (late, early) = (message(), message());
        let long = "x".repeat(crate::store::MAX_ERROR_LEN + 10);
        let rows = vec![
            (1, Ok(late.clone())),
            (9, Err("bad".to_string())),
            (2, Ok(early.clone())),
            (5, Err(long)),
        ];
        let backend = Rows::default();
        let claimed = finish_claim(&backend, token, rows).await.unwrap();
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(
            ids,
            [early.id, late.id],
            "claim order is the decoder's order"
        );
        assert!(claimed.iter().all(|c| c.lease.token == token));
        assert_eq!(claimed.dead_lettered, 2);
        let dead = backend.dead.lock().unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].0, token);
        let dead_ids: Vec<i32> = dead[0].1.iter().map(|(id, _)| *id).collect();
        assert_eq!(dead_ids, [5, 9], "poison is written in id order");
        assert_eq!(dead[0].1[0].1.len(), crate::store::MAX_ERROR_LEN);
        assert_eq!(dead[0].1[1].1, "bad");
        assert!(backend.released.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_claim_without_poison_writes_nothing_and_a_failed_dead_letter_counts_none() {
        let backend = Rows::default();
        let claimed = finish_claim(&backend, LeaseToken::new(), vec![(1, Ok(message()))])
            .await
            .unwrap();
        assert_eq!((claimed.len(), claimed.dead_lettered), (1, 0));
        assert!(backend.dead.lock().unwrap().is_empty());

        let failing = Rows {
            write_fails: true,
            ..Rows::default()
        };
        let rows = vec![(1, Ok(message())), (2, Err("bad".to_string()))];
        let claimed = finish_claim(&failing, LeaseToken::new(), rows)
            .await
            .unwrap();
        assert_eq!((claimed.len(), claimed.dead_lettered), (1, 0));
        assert_eq!(failing.dead.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_undecodable_claim_is_released_by_sorted_id_and_its_error_returned() {
        let token = LeaseToken::new();
        for write_fails in [false, true] {
            let backend = Rows {
                shape_error: true,
                write_fails,
                ..Rows::default()
            };
            let rows = vec![(7, Ok(message())), (3, Err("bad".to_string()))];
            let err = finish_claim(&backend, token, rows).await.unwrap_err();
            assert_eq!(err.message(), "shape");
            assert_eq!(*backend.released.lock().unwrap(), [(token, vec![3, 7])]);
            assert!(backend.dead.lock().unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn a_claim_whose_ids_do_not_decode_is_left_to_expire() {
        let backend = Rows {
            shape_error: true,
            ..Rows::default()
        };
        let rows = vec![(7, Ok(message())), (-1, Ok(message()))];
        let err = finish_claim(&backend, LeaseToken::new(), rows)
            .await
            .unwrap_err();
        assert_eq!(err.message(), "shape");
        assert!(backend.released.lock().unwrap().is_empty());
    }
}
