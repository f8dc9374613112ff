//! Stream sequence numbers: decimal strings of up to 40 digits (DynamoDB Local pads
//! them with zeros to 21), ordered as the numbers they write, not as text.

use std::cmp::Ordering;
use std::fmt;

/// A record's sequence number within its shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SequenceNumber(String);

impl SequenceNumber {
    /// `text` when it is a decimal number (leading zeros allowed), else `None`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        (!text.is_empty() && text.len() <= 64 && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| SequenceNumber(text.to_owned()))
    }

    /// The number as the stream wrote it (what `AFTER_SEQUENCE_NUMBER` takes).
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    fn digits(&self) -> &str {
        let trimmed = self.0.trim_start_matches('0');
        if trimmed.is_empty() {
            "0"
        } else {
            trimmed
        }
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.digits(), other.digits());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(t: &str) -> SequenceNumber {
        SequenceNumber::parse(t).unwrap()
    }

    #[test]
    fn numbers_order_by_value_whatever_their_padding() {
        assert!(seq("000000000000000000009") < seq("000000000000000000010"));
        assert!(seq("9") < seq("10"));
        assert!(seq("10") > seq("000000000000000000009"));
        assert_eq!(seq("007").cmp(&seq("7")), Ordering::Equal);
        assert!(seq("0") < seq("1"));
        assert_eq!(seq("000").cmp(&seq("0")), Ordering::Equal);
        // Past u128: still ordered.
        let big = "1".repeat(40);
        let bigger = format!("2{}", "1".repeat(39));
        assert!(seq(&big) < seq(&bigger));
        assert_eq!(seq("0042").as_str(), "0042");
        assert_eq!(seq("0042").to_string(), "0042");
    }

    #[test]
    fn only_decimal_digits_parse() {
        for bad in ["", "12a", "-1", "1.0", " 1", &"1".repeat(65)] {
            assert!(SequenceNumber::parse(bad).is_none(), "{bad:?}");
        }
    }
}
