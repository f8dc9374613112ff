//! What operators read before they act: dead letters in either order, dead letters by
//! id, and exact counts of what a requeue, discard or purge would touch.

use crate::harness::declared::SEALED;
use std::time::Duration;

use outbox_core::{
    store::Disposition, store::OutboxStoreExt, DeadLetterOrder, DeadLetterSelection,
};

use super::*;
use crate::harness::Harness;

/// Dead-letter every message of `batch` (enqueued and claimed here); returns their
/// ids, ascending.
async fn kill_all(f: &dyn Fixture, batch: Vec<NewMessage>) -> Vec<MessageId> {
    let store = f.store();
    let n = batch.len();
    f.enqueue(batch).await.unwrap();
    let got = claim(&*store, n, LONG_LEASE).await;
    assert_eq!(got.len(), n);
    let mut ids = Vec::with_capacity(n);
    for c in got {
        ids.push(c.message.id);
        store
            .fail_one(failure(c.lease, "poison", Disposition::DeadLetter))
            .await
            .unwrap();
    }
    ids.sort();
    ids
}

/// Every page of `page`'s listing, followed by its cursor, as ids. Bounded: a store
/// that ignored the cursor would hand out the same page for ever, so past one page per
/// dead letter there is (`dead`, plus the empty page that ends the listing) the case
/// fails instead of looping.
async fn all_pages(admin: &dyn OutboxAdmin, page: DeadLetterPage, dead: usize) -> Vec<MessageId> {
    let mut ids = Vec::new();
    let mut next = page.clone();
    for _ in 0..=dead {
        let got = admin.dead_letters(&next).await.unwrap();
        assert!(got.len() <= page.limit(), "pages keep their limit");
        let Some(last) = got.last() else {
            return ids;
        };
        next = page.clone().after(last.message.id);
        ids.extend(got.iter().map(|d| d.message.id));
    }
    panic!(
        "{} pages of {dead} dead letters did not end the listing: is the cursor ignored?",
        dead + 1
    )
}

/// Descending pages list dead letters highest id first, page by page past the cursor,
/// with the filter applied: exactly the ascending listing reversed.
pub async fn dead_letters_are_listed_newest_first(h: &dyn Harness) {
    let f = plain(h).await;
    let admin = f.admin();
    let batch = vec![
        msg("a", 0),
        msg("b", 1),
        msg("a", 2),
        msg("a", 3),
        msg("b", 4),
    ];
    let ids = kill_all(&*f, batch).await;

    let all = DeadLetterFilter::default();
    let up = DeadLetterPage::new(all.clone(), 2).unwrap();
    let down = up.clone().with_order(DeadLetterOrder::Descending);
    assert_eq!(
        all_pages(&*admin, up, ids.len()).await,
        ids,
        "ascending: lowest id first"
    );
    let mut reversed = ids.clone();
    reversed.reverse();
    assert_eq!(
        all_pages(&*admin, down.clone(), ids.len()).await,
        reversed,
        "descending: highest id first, across pages"
    );
    let first = admin.dead_letters(&down).await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].message.id, ids[4]);
    assert_eq!(first[0].message.last_error.as_deref(), Some("poison"));

    let only_a = all.with_destination("a").unwrap();
    let a_down = DeadLetterPage::new(only_a.clone(), 10)
        .unwrap()
        .with_order(DeadLetterOrder::Descending);
    let a: Vec<String> = admin
        .dead_letters(&a_down)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.message.destination)
        .collect();
    assert_eq!(a, ["a", "a", "a"]);
    let a_ids = all_pages(&*admin, a_down.clone(), ids.len()).await;
    assert!(
        a_ids.windows(2).all(|w| w[0] > w[1]),
        "descending: {a_ids:?}"
    );
    let past_the_end = a_down.after(*ids.first().unwrap());
    assert!(
        admin.dead_letters(&past_the_end).await.unwrap().is_empty(),
        "nothing lies below the lowest id"
    );
}

/// A filter by ids lists, counts, requeues and discards those dead letters only:
/// unknown ids and ids of messages that are not dead match nothing, and an empty id
/// list matches no dead letter.
pub async fn dead_letters_are_found_by_id(h: &dyn Harness) {
    let f = plain(h).await;
    let (store, admin) = (f.store(), f.admin());
    let dead = kill_all(&*f, vec![msg("a", 0), msg("a", 1), msg("b", 2)]).await;
    let live = msg("live", 3);
    let live_id = live.id();
    f.enqueue(vec![live]).await.unwrap();

    let wanted = [dead[2], MessageId::new(), live_id, dead[2]];
    let filter = DeadLetterFilter::default().with_ids(wanted).unwrap();
    let page = DeadLetterPage::new(filter.clone(), 10).unwrap();
    let found = admin.dead_letters(&page).await.unwrap();
    assert_eq!(found.len(), 1, "only the dead letter among the ids");
    assert_eq!(found[0].message.id, dead[2]);
    assert_eq!(found[0].message.destination, "b");
    assert_eq!(admin.count_dead(&filter).await.unwrap(), 1);
    let other_destination = filter.clone().with_destination("a").unwrap();
    assert_eq!(
        admin.count_dead(&other_destination).await.unwrap(),
        0,
        "conditions combine"
    );

    let none = DeadLetterFilter::default().with_ids([]).unwrap();
    let empty = DeadLetterPage::new(none.clone(), 10).unwrap();
    assert!(admin.dead_letters(&empty).await.unwrap().is_empty());
    assert_eq!(admin.count_dead(&none).await.unwrap(), 0);
    let nothing = DeadLetterSelection::Matching {
        filter: none,
        limit: 10,
    };
    assert_eq!(admin.requeue_dead(&nothing).await.unwrap(), 0);
    assert_eq!(admin.discard_dead(&nothing).await.unwrap(), 0);

    let first = DeadLetterFilter::default().with_ids([dead[0]]).unwrap();
    let requeue_first = DeadLetterSelection::Matching {
        filter: first,
        limit: 10,
    };
    assert_eq!(admin.requeue_dead(&requeue_first).await.unwrap(), 1);
    let by_filter = DeadLetterSelection::Matching { filter, limit: 10 };
    assert_eq!(admin.discard_dead(&by_filter).await.unwrap(), 1);
    let s = stats(&*admin).await;
    assert_eq!((s.pending, s.dead), (2, 1), "one requeued, one discarded");
    assert_eq!(
        dead_letters(&*admin)
            .await
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>(),
        [dead[1]]
    );
    let claimed: Vec<MessageId> = claim(&*store, 10, LONG_LEASE)
        .await
        .iter()
        .map(|c| c.message.id)
        .collect();
    assert!(claimed.contains(&dead[0]) && claimed.contains(&live_id));
}

/// Dead-letter counts are exact and follow the filter as listing does.
pub async fn dead_letters_are_counted_by_filter(h: &dyn Harness) {
    let f = plain(h).await;
    let admin = f.admin();
    let all = DeadLetterFilter::default();
    assert_eq!(admin.count_dead(&all).await.unwrap(), 0);
    kill_all(&*f, vec![msg("a", 0), msg("a", 1), msg("b", 2)]).await;
    f.enqueue(msgs(2)).await.unwrap();

    assert_eq!(admin.count_dead(&all).await.unwrap(), 3);
    let a = all.clone().with_destination("a").unwrap();
    assert_eq!(admin.count_dead(&a).await.unwrap(), 2);
    let nowhere = all.clone().with_destination("nowhere").unwrap();
    assert_eq!(admin.count_dead(&nowhere).await.unwrap(), 0);
    let old = all.clone().with_dead_for(Duration::from_secs(3600));
    assert_eq!(
        admin.count_dead(&old).await.unwrap(),
        0,
        "nothing died an hour ago"
    );
    let huge = all.clone().with_dead_for(Duration::MAX);
    assert_eq!(admin.count_dead(&huge).await.unwrap(), 0, "ages saturate");
    wait_until("the dead letters to age a little", || {
        let admin = std::sync::Arc::clone(&admin);
        let young = all.clone().with_dead_for(Duration::from_millis(50));
        async move { admin.count_dead(&young).await.unwrap() == 3 }
    })
    .await;
    let page = DeadLetterPage::new(a.clone(), 10).unwrap();
    let listed = admin.dead_letters(&page).await.unwrap().len() as u64;
    assert_eq!(admin.count_dead(&a).await.unwrap(), listed);
}

/// `count_dispatched` counts exactly what purges with the same age delete over all
/// their batches, and changes nothing; under `Retention::Delete` it is 0, as purges
/// are.
pub async fn dispatched_counts_match_what_purges_delete(h: &dyn Harness) {
    let deleting = plain(h).await;
    deleting.enqueue(msgs(2)).await.unwrap();
    let got = claim(&*deleting.store(), 2, LONG_LEASE).await;
    deleting.store().complete_one(&got[0].lease).await.unwrap();
    assert_eq!(
        deleting
            .admin()
            .count_dispatched(Duration::ZERO)
            .await
            .unwrap(),
        0,
        "no history under Retention::Delete"
    );
    require(h.features(SEALED).keep_retention, "keep_retention");
    let f = fixture(h, keeping()).await;
    let (store, admin) = (f.store(), f.admin());
    f.enqueue(msgs(9)).await.unwrap();
    let got = claim_each(&*store, 8, LONG_LEASE).await;
    let leases: Vec<_> = got[..6].iter().map(|c| c.lease).collect();
    store
        .complete(&leases)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    store
        .fail_one(failure(got[6].lease, "dead", Disposition::DeadLetter))
        .await
        .unwrap();
    // got[7] stays in flight, one message stays pending.

    assert_eq!(
        admin
            .count_dispatched(Duration::from_secs(3600))
            .await
            .unwrap(),
        0,
        "inside the window"
    );
    assert_eq!(
        admin.count_dispatched(Duration::MAX).await.unwrap(),
        0,
        "ages saturate"
    );
    let counted = admin.count_dispatched(Duration::ZERO).await.unwrap();
    assert_eq!(counted, 6, "dispatched rows only");
    let before = stats(&*admin).await;
    assert_eq!(before.dispatched, 6, "counting deletes nothing");
    let mut purged = 0;
    // Bounded: every purge but the last deletes at least one of the counted rows.
    for _ in 0..=counted {
        let n = admin.purge_dispatched(Duration::ZERO, 4).await.unwrap();
        if n == 0 {
            break;
        }
        purged += n;
        assert!(
            purged <= counted,
            "purges deleted {purged} of {counted} dispatched rows"
        );
    }
    assert_eq!(purged, counted, "the count is what the purges deleted");
    assert_eq!(admin.count_dispatched(Duration::ZERO).await.unwrap(), 0);
    let s = stats(&*admin).await;
    assert_eq!((s.pending, s.in_flight, s.dead, s.dispatched), (1, 1, 1, 0));
}

/// A dead letter that another tool also stamped dispatched: whatever it is counted as,
/// requeueing it brings back exactly what was counted dead, and a message requeued is
/// claimable again. (It used to be counted and listed dead, requeue reported it, and it
/// never came due: the dispatched time kept it out of every claim and count.)
pub async fn a_dead_letter_stamped_dispatched_is_requeued_whole(h: &dyn Harness) {
    let f = plain(h).await;
    let (store, admin) = (f.store(), f.admin());
    let id = kill_all(&*f, vec![msg("c", 0)]).await[0];
    f.mark_dispatched(id)
        .await
        .expect("the fixture stamps a row dispatched");
    let counted = admin
        .count_dead(&DeadLetterFilter::default())
        .await
        .unwrap();
    let listed = admin
        .dead_letters(&DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap())
        .await
        .unwrap();
    assert_eq!(listed.len() as u64, counted, "listing and count agree");
    let requeued = admin
        .requeue_dead(&DeadLetterSelection::Ids(vec![id]))
        .await
        .unwrap();
    assert_eq!(
        requeued, counted,
        "what is counted dead is what requeue brings back"
    );
    if requeued == 1 {
        let again = claim(&*store, 10, LONG_LEASE).await;
        let ids: Vec<MessageId> = again.iter().map(|c| c.message.id).collect();
        assert_eq!(ids, [id], "the requeued message is claimable again");
        assert_eq!(stats(&*admin).await.dead, 0);
    }
}
