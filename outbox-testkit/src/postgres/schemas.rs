//! Dropping the test schemas an earlier run left behind: the schemas named by
//! [`isolation::unique_name`] that [`isolation::is_stale`] says are old. Run once per
//! test binary, with the backend's own driver.

use crate::isolation;

/// The names of every schema that may be a test fixture (`obx_...`), as text.
pub const FIXTURE_SCHEMAS: &str =
    "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'obx\\_%'";

/// The statements dropping the stale schemas among `names` (the rows of
/// [`FIXTURE_SCHEMAS`]); a name that is not a stale fixture name gets none, so no
/// schema a test did not make is ever dropped.
pub fn drop_stale(names: impl IntoIterator<Item = String>) -> Vec<String> {
    names
        .into_iter()
        // Fixture names are plain identifiers (`obx_<digits>_<hex>`): nothing to escape.
        .filter(|name| isolation::is_stale(name))
        .map(|name| format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stale_fixture_schemas_are_dropped() {
        let fresh = isolation::unique_name();
        let old = "obx_1000_0123456789ab".to_owned();
        let drops = drop_stale([fresh, old.clone(), "public".to_owned(), "obx_x".to_owned()]);
        assert_eq!(drops, [format!("DROP SCHEMA IF EXISTS \"{old}\" CASCADE")]);
    }
}
