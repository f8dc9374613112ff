//! Splitting one queue's messages into `SendMessageBatch` requests: at most
//! [`MAX_BATCH_ENTRIES`] entries and at most the size limit in total, in the batch's
//! order.

/// The most entries SQS takes in one `SendMessageBatch`.
pub const MAX_BATCH_ENTRIES: usize = 10;

/// Split `entries` (a message's position in the batch and its size as SQS counts it)
/// into requests of at most [`MAX_BATCH_ENTRIES`] entries whose sizes add up to at
/// most `max_bytes`, keeping their order. Every size must be at most `max_bytes`
/// (oversize messages are refused before this), so every request is non-empty.
pub(crate) fn chunks(entries: &[(usize, usize)], max_bytes: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::with_capacity(MAX_BATCH_ENTRIES);
    let mut bytes = 0;
    for &(index, size) in entries {
        debug_assert!(size <= max_bytes, "oversize messages are refused earlier");
        if current.len() == MAX_BATCH_ENTRIES || (!current.is_empty() && bytes + size > max_bytes) {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(index);
        bytes += size;
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    fn sized(sizes: &[usize]) -> Vec<(usize, usize)> {
        sizes.iter().copied().enumerate().collect()
    }

    #[test]
    fn ten_entries_at_most_in_order() {
        let entries = sized(&[1; 25]);
        let got = chunks(&entries, 256 * KIB);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (0..10).collect::<Vec<_>>());
        assert_eq!(got[1], (10..20).collect::<Vec<_>>());
        assert_eq!(got[2], (20..25).collect::<Vec<_>>());
        assert!(chunks(&[], 256 * KIB).is_empty());
        assert_eq!(chunks(&sized(&[1; 10]), 256 * KIB).len(), 1);
    }

    #[test]
    fn the_request_size_splits_before_ten() {
        // 100 KiB each: two fit in 256 KiB, a third does not.
        let got = chunks(&sized(&[100 * KIB; 5]), 256 * KIB);
        assert_eq!(got, vec![vec![0, 1], vec![2, 3], vec![4]]);
        // Exactly at the limit fits.
        let got = chunks(&sized(&[128 * KIB, 128 * KIB, 1]), 256 * KIB);
        assert_eq!(got, vec![vec![0, 1], vec![2]]);
        // A message of the full size goes alone.
        let got = chunks(&sized(&[1, 256 * KIB, 1]), 256 * KIB);
        assert_eq!(got, vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn every_chunk_keeps_both_limits_on_mixed_sizes() {
        let sizes: Vec<usize> = (0..500).map(|i| (i * 7919) % (90 * KIB) + 1).collect();
        let entries = sized(&sizes);
        let got = chunks(&entries, 256 * KIB);
        let flat: Vec<usize> = got.iter().flatten().copied().collect();
        assert_eq!(
            flat,
            (0..500).collect::<Vec<_>>(),
            "every entry once, in order"
        );
        for chunk in &got {
            assert!(!chunk.is_empty() && chunk.len() <= MAX_BATCH_ENTRIES);
            assert!(chunk.iter().map(|&i| sizes[i]).sum::<usize>() <= 256 * KIB);
        }
    }

    #[test]
    fn positions_are_kept_when_entries_are_a_subset() {
        let entries = vec![(3, 1), (7, 1), (8, 1)];
        assert_eq!(chunks(&entries, 256 * KIB), vec![vec![3, 7, 8]]);
    }
}
