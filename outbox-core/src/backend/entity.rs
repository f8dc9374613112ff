//! Entity versions between [`Version`] and a signed 64-bit column, the same way on
//! every backend that stores them as such.

use crate::consumer::{EntityRecord, Loaded, Version};
use crate::error::{Error, ErrorKind, Result};
use crate::names::EntityKey;

/// A loaded entity from its stored columns: the state as is, the outbox state decoded
/// from JSON, the version by [`entity_version`].
///
/// # Errors
/// [`ErrorKind::Decode`] when the outbox state does not decode or the version is
/// negative.
pub fn loaded_entity(
    key: &EntityKey,
    state: serde_json::Value,
    outbox: serde_json::Value,
    version: i64,
) -> Result<Loaded> {
    let outbox = serde_json::from_value(outbox).map_err(|e| {
        Error::new(
            ErrorKind::Decode,
            format!("the outbox state of entity {key} does not decode"),
        )
        .with_source(e)
    })?;
    Ok(Loaded {
        record: EntityRecord { state, outbox },
        version: entity_version(version)?,
    })
}

/// A stored entity version as a [`Version`].
///
/// # Errors
/// [`ErrorKind::Decode`] for a negative value (the column was written by something
/// else).
pub fn entity_version(stored: i64) -> Result<Version> {
    u64::try_from(stored).map(Version::new).map_err(|_| {
        Error::new(
            ErrorKind::Decode,
            format!("entity version {stored} is negative"),
        )
    })
}

/// A [`Version`] for binding to a signed 64-bit column; `column` names its type in the
/// error (`"a bigint"`, `"64 bits"`).
///
/// # Errors
/// [`ErrorKind::InvalidInput`] for a version above `i64::MAX`.
pub fn stored_entity_version(v: Version, column: &str) -> Result<i64> {
    i64::try_from(v.get()).map_err(|_| {
        Error::invalid_input(format!("entity version {} does not fit {column}", v.get()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip_and_refuse_what_does_not_fit() {
        assert_eq!(entity_version(3).unwrap(), Version::new(3));
        assert_eq!(entity_version(-1).unwrap_err().kind(), ErrorKind::Decode);
        assert_eq!(
            stored_entity_version(Version::new(7), "a bigint").unwrap(),
            7
        );
        let err = stored_entity_version(Version::new(u64::MAX), "a bigint").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.message().ends_with("does not fit a bigint"), "{err}");
        let key = EntityKey::new("k").unwrap();
        let bad = loaded_entity(&key, serde_json::json!({}), serde_json::json!(1), 1);
        assert_eq!(bad.unwrap_err().kind(), ErrorKind::Decode);
    }
}
