//! What a relay may read, and which shards it should own: pure decisions over the
//! stream's shards and the lease table, tested on synthetic shard trees.
//!
//! **Lineage.** A stream shard is closed when its partition splits (or, every few
//! hours, rolls over); its records continue in one or two children, which name it as
//! their parent. A child is read only after its parent was read to its end (the
//! parent's lease holds [`Position::End`]), so an item's records are published in the
//! order they were written. A parent no longer listed by the stream (trimmed after the
//! 24-hour retention) and without a lease counts as finished; one listed without a
//! lease yet holds its children back until discovery creates its lease.
//!
//! **Balance.** As the Kinesis Client Library does: each live worker aims at
//! ⌈readable shards ÷ live workers⌉, takes free and lapsed leases first, then steals one
//! lease per round from the worker holding the most while that one holds more than the
//! target.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::sequence::SequenceNumber;

/// Where a shard's reading stands, as its lease records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Position {
    /// Nothing checkpointed: read from the oldest record the stream keeps.
    TrimHorizon,
    /// Every record up to and including this one was published (or skipped).
    After(SequenceNumber),
    /// The shard was read to its end: its children may be read.
    End,
}

/// One shard's lease as read from the lease table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardLease {
    pub(crate) shard: String,
    pub(crate) parent: Option<String>,
    pub(crate) owner: Option<String>,
    /// Ownership changes so far: every take adds one, so a write conditional on the
    /// counter fails once another worker took the lease.
    pub(crate) counter: u64,
    pub(crate) expires_us: u64,
    pub(crate) position: Position,
    /// When the lease was created (microseconds): where a replay starts when nothing
    /// was checkpointed.
    pub(crate) since_us: u64,
    /// The commit time of the last record checkpointed (microseconds), when known.
    pub(crate) checkpoint_us: Option<u64>,
    /// The relay found the stream trimmed past the checkpoint (see the crate docs'
    /// recovery).
    pub(crate) trimmed: bool,
}

impl ShardLease {
    /// Whether a live worker other than `me` holds it at `now`.
    pub(crate) fn held_by_other(&self, me: &str, now: u64) -> bool {
        self.owner.as_deref().is_some_and(|o| o != me) && self.expires_us > now
    }

    /// Whether nobody holds it at `now` (never taken, released, or lapsed).
    pub(crate) fn is_free(&self, now: u64) -> bool {
        self.owner.is_none() || self.expires_us <= now
    }
}

/// The shards that may be read now: not finished, not trimmed, and whose parent is
/// finished (or gone from the stream without a lease). `listed`: the shard ids the
/// stream lists.
pub(crate) fn readable<'a>(
    listed: &HashSet<String>,
    leases: &'a BTreeMap<String, ShardLease>,
) -> Vec<&'a ShardLease> {
    leases
        .values()
        .filter(|l| l.position != Position::End && !l.trimmed)
        .filter(|l| match &l.parent {
            None => true,
            Some(parent) => match leases.get(parent) {
                Some(p) => p.position == Position::End,
                None => !listed.contains(parent),
            },
        })
        .collect()
}

/// A lease to take: free (or lapsed) ones conditional on being free, stolen ones on
/// the owner and counter read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Take {
    pub(crate) shard: String,
    /// `Some((owner, counter))` for a steal.
    pub(crate) from: Option<(String, u64)>,
}

/// The leases worker `me` should take at `now`, holding `held`, among `readable`,
/// with `workers` live workers (itself included).
pub(crate) fn plan(
    me: &str,
    now: u64,
    workers: usize,
    readable: &[&ShardLease],
    held: &BTreeSet<String>,
) -> Vec<Take> {
    if readable.is_empty() {
        return Vec::new();
    }
    let target = readable.len().div_ceil(workers.max(1));
    let mine = readable.iter().filter(|l| held.contains(&l.shard)).count();
    let mut want = target.saturating_sub(mine);
    let mut takes: Vec<Take> = readable
        .iter()
        .filter(|l| !held.contains(&l.shard) && l.is_free(now))
        .take(want)
        .map(|l| Take {
            shard: l.shard.clone(),
            from: None,
        })
        .collect();
    want -= takes.len();
    if want == 0 {
        return takes;
    }
    // Steal one from the busiest other worker, while it holds more than the target.
    let mut by_owner: HashMap<&str, Vec<&ShardLease>> = HashMap::new();
    for l in readable.iter().filter(|l| l.held_by_other(me, now)) {
        by_owner
            .entry(l.owner.as_deref().unwrap_or_default())
            .or_default()
            .push(l);
    }
    let busiest = by_owner
        .into_iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(a.0)));
    if let Some((owner, leases)) = busiest {
        if leases.len() > target {
            let victim = leases[leases.len() - 1];
            takes.push(Take {
                shard: victim.shard.clone(),
                from: Some((owner.to_owned(), victim.counter)),
            });
        }
    }
    takes
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000;

    fn lease(shard: &str, parent: Option<&str>) -> ShardLease {
        ShardLease {
            shard: shard.to_owned(),
            parent: parent.map(str::to_owned),
            owner: None,
            counter: 0,
            expires_us: 0,
            position: Position::TrimHorizon,
            since_us: 0,
            checkpoint_us: None,
            trimmed: false,
        }
    }

    fn owned(mut l: ShardLease, owner: &str, counter: u64) -> ShardLease {
        l.owner = Some(owner.to_owned());
        l.counter = counter;
        l.expires_us = NOW + 10;
        l
    }

    fn ended(mut l: ShardLease) -> ShardLease {
        l.position = Position::End;
        l
    }

    fn table(leases: Vec<ShardLease>) -> BTreeMap<String, ShardLease> {
        leases.into_iter().map(|l| (l.shard.clone(), l)).collect()
    }

    fn listed(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    fn ids(leases: &[&ShardLease]) -> Vec<String> {
        leases.iter().map(|l| l.shard.clone()).collect()
    }

    #[test]
    fn children_wait_for_their_parent_to_end() {
        // a split into b and c; c later split into d and e.
        let tree = vec![
            lease("a", None),
            lease("b", Some("a")),
            lease("c", Some("a")),
            lease("d", Some("c")),
            lease("e", Some("c")),
        ];
        let all = listed(&["a", "b", "c", "d", "e"]);
        assert_eq!(ids(&readable(&all, &table(tree.clone()))), ["a"]);
        // a read to its end: both children open, not the grandchildren.
        let mut t = tree.clone();
        t[0] = ended(t[0].clone());
        assert_eq!(ids(&readable(&all, &table(t.clone()))), ["b", "c"]);
        // c ended while b is still being read: d and e open beside b.
        t[2] = ended(t[2].clone());
        assert_eq!(ids(&readable(&all, &table(t))), ["b", "d", "e"]);
    }

    #[test]
    fn a_parent_trimmed_away_frees_its_children_but_a_listed_one_without_lease_does_not() {
        let t = table(vec![lease("b", Some("a")), lease("c", Some("a"))]);
        // a is gone from the stream and has no lease: nothing of it can be read.
        assert_eq!(ids(&readable(&listed(&["b", "c"]), &t)), ["b", "c"]);
        // a is listed but its lease is not created yet: wait for discovery.
        assert!(readable(&listed(&["a", "b", "c"]), &t).is_empty());
    }

    #[test]
    fn ended_and_trimmed_shards_are_not_read() {
        let mut trimmed = lease("t", None);
        trimmed.trimmed = true;
        let t = table(vec![
            ended(lease("a", None)),
            trimmed,
            lease("b", Some("a")),
        ]);
        assert_eq!(ids(&readable(&listed(&["a", "b", "t"]), &t)), ["b"]);
    }

    #[test]
    fn a_shard_ending_while_owned_hands_over_to_its_children() {
        // The owner of a finishes it (End) and keeps no lease; the children become
        // readable and are free, so the next plan takes them.
        let mut a = ended(owned(lease("a", None), "w1", 3));
        a.owner = None;
        let t = table(vec![a, lease("b", Some("a")), lease("c", Some("a"))]);
        let r = readable(&listed(&["a", "b", "c"]), &t);
        let takes = plan("w1", NOW, 1, &r, &BTreeSet::new());
        assert_eq!(
            takes.iter().map(|t| t.shard.as_str()).collect::<Vec<_>>(),
            ["b", "c"]
        );
        assert!(takes.iter().all(|t| t.from.is_none()));
    }

    #[test]
    fn workers_split_the_readable_shards_taking_free_and_lapsed_first() {
        let mut lapsed = owned(lease("c", None), "dead", 4);
        lapsed.expires_us = NOW;
        let t = table(vec![
            lease("a", None),
            owned(lease("b", None), "w2", 1),
            lapsed,
            lease("d", None),
        ]);
        let r = readable(&listed(&["a", "b", "c", "d"]), &t);
        // Two live workers, four shards: a target of two each; w1 holds none.
        let takes = plan("w1", NOW, 2, &r, &BTreeSet::new());
        assert_eq!(
            takes,
            vec![
                Take {
                    shard: "a".into(),
                    from: None
                },
                Take {
                    shard: "c".into(),
                    from: None
                }
            ]
        );
        // Holding its share, a worker takes nothing more.
        let held: BTreeSet<String> = ["a".to_owned(), "c".to_owned()].into();
        assert!(plan("w1", NOW, 2, &r, &held).is_empty());
    }

    #[test]
    fn a_worker_below_target_steals_one_lease_per_round_from_the_busiest() {
        let t = table(vec![
            owned(lease("a", None), "w2", 1),
            owned(lease("b", None), "w2", 5),
            owned(lease("c", None), "w2", 2),
            owned(lease("d", None), "w3", 1),
        ]);
        let r = readable(&listed(&["a", "b", "c", "d"]), &t);
        // Three workers, four shards: target 2; w2 holds 3 > 2.
        let takes = plan("w1", NOW, 3, &r, &BTreeSet::new());
        assert_eq!(
            takes,
            vec![Take {
                shard: "c".into(),
                from: Some(("w2".into(), 2))
            }]
        );
        // Nobody above target: no steal (two workers, target 2, w2 holds exactly 2).
        let t = table(vec![
            owned(lease("a", None), "w2", 1),
            owned(lease("b", None), "w2", 5),
            owned(lease("d", None), "w3", 1),
        ]);
        let r = readable(&listed(&["a", "b", "d"]), &t);
        assert!(plan("w1", NOW, 2, &r, &BTreeSet::new()).is_empty());
        // Nothing readable: nothing to take.
        assert!(plan("w1", NOW, 1, &[], &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_lease_lapsed_just_now_is_taken_as_free_and_never_also_stolen() {
        let mut lapsed = owned(lease("d", None), "w2", 7);
        lapsed.expires_us = NOW;
        let t = table(vec![
            owned(lease("a", None), "w2", 1),
            owned(lease("b", None), "w2", 1),
            owned(lease("c", None), "w2", 1),
            lapsed,
        ]);
        let r = readable(&listed(&["a", "b", "c", "d"]), &t);
        // Two workers: target 2. d is free (lapsed at `now`); the steal comes from w2's
        // three live leases, not d again.
        assert_eq!(
            plan("w1", NOW, 2, &r, &BTreeSet::new()),
            vec![
                Take {
                    shard: "d".into(),
                    from: None
                },
                Take {
                    shard: "c".into(),
                    from: Some(("w2".into(), 1))
                }
            ]
        );
    }

    #[test]
    fn no_steal_once_free_leases_reach_the_target() {
        let t = table(vec![
            lease("a", None),
            lease("b", None),
            lease("c", None),
            owned(lease("d", None), "w2", 1),
            owned(lease("e", None), "w2", 1),
            owned(lease("f", None), "w2", 1),
            owned(lease("g", None), "w2", 1),
        ]);
        let r = readable(&listed(&["a", "b", "c", "d", "e", "f", "g"]), &t);
        // Three workers, seven shards: target 3, all of it free; w2 holds 4, more than
        // the target, but this round's takes already reach it.
        let takes = plan("w1", NOW, 3, &r, &BTreeSet::new());
        assert_eq!(
            takes.iter().map(|t| t.shard.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert!(takes.iter().all(|t| t.from.is_none()));
    }
}
