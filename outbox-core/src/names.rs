//! Validated names: the one home of the rules every backend applies to consumer names,
//! lock names, entity keys and SQL identifiers.
//!
//! Each type checks its rule once, when it is made; a backend that takes the type never
//! re-checks it, so no two backends can disagree on what a valid name is.

use std::fmt;

use crate::error::{Error, Result};

/// Longest [`ConsumerName`], [`LockName`] or [`EntityKey`], in bytes.
pub const MAX_NAME_LEN: usize = 255;

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.trim().is_empty() {
        return Err(Error::invalid_input(format!("{what} is empty")));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::invalid_input(format!(
            "{what} of {} bytes exceeds the limit of {MAX_NAME_LEN} bytes",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::invalid_input(format!(
            "{what} {name:?} contains a control character"
        )));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("A ", $what, ": 1 to [`MAX_NAME_LEN`] bytes, not blank, no control characters.")]
            ///
            /// # Errors
            /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the
            /// broken rule.
            pub fn new(name: impl Into<String>) -> Result<Self> {
                let name = name.into();
                check_name($what, &name)?;
                Ok($name(name))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self> {
                $name::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = Error;

            fn try_from(s: &str) -> Result<Self> {
                $name::new(s)
            }
        }
    };
}

name_type!(
    /// The consumer a [`DedupStore`](crate::DedupStore) record belongs to: the same
    /// message id processed by two consumers is two records.
    ConsumerName,
    "consumer name"
);

name_type!(
    /// The name of a [`DistributedLock`](crate::DistributedLock): every process using
    /// the same name on the same storage excludes the others.
    LockName,
    "lock name"
);

name_type!(
    /// The key of an entity in an [`EntityStore`](crate::consumer::EntityStore): the
    /// correlation id that routes messages to one aggregate (an order id, an account
    /// id).
    EntityKey,
    "entity key"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn names_follow_one_rule() {
        for ok in [
            "orders",
            "billing consumer",
            "a/b:c",
            &"n".repeat(MAX_NAME_LEN),
        ] {
            assert_eq!(ConsumerName::new(ok).unwrap().as_str(), ok);
            assert_eq!(LockName::new(ok).unwrap().to_string(), ok);
            assert_eq!(EntityKey::new(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            "   ",
            "tab\there",
            "new\nline",
            "nul\0",
            &"n".repeat(MAX_NAME_LEN + 1),
        ] {
            assert_eq!(
                ConsumerName::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{bad:?}"
            );
            assert_eq!(
                bad.parse::<LockName>().unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
            assert_eq!(
                EntityKey::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
        }
    }
}
