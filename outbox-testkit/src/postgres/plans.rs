//! Reading PostgreSQL's `EXPLAIN (COSTS OFF)` text: how each plan line reaches the
//! outbox table, as the plan suite's [`Access`] steps.

use crate::harness::plan::Access;

/// How a line of `EXPLAIN (COSTS OFF)` reaches `table` (its unqualified name), if it
/// does: a sequential or TID range scan is a [`Access::Scan`], a TID scan or the
/// primary key (`<table>_pkey`) is [`Access::ByKey`], any other index of the table is
/// [`Access::Index`]. Lines about other tables (`<table>_held`, a join's other side)
/// give `None`.
pub fn access(line: &str, table: &str) -> Option<Access> {
    let line = line.trim_start_matches([' ', '-', '>']);
    let index = |rest: &str| {
        let index = rest
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        if index == format!("{table}_pkey") {
            Access::ByKey
        } else {
            Access::Index(index)
        }
    };
    let on_table = |rest: &str| rest.split_whitespace().next() == Some(table);
    if let Some(rest) = line.strip_prefix("Seq Scan on ") {
        return on_table(rest).then(|| Access::Scan(line.to_owned()));
    }
    if let Some(rest) = line.strip_prefix("Tid Range Scan on ") {
        return on_table(rest).then(|| Access::Scan(line.to_owned()));
    }
    if let Some(rest) = line.strip_prefix("Tid Scan on ") {
        return on_table(rest).then_some(Access::ByKey);
    }
    for prefix in [
        "Index Scan using ",
        "Index Scan Backward using ",
        "Index Only Scan using ",
        "Index Only Scan Backward using ",
        "Bitmap Index Scan on ",
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.starts_with(table).then(|| index(rest));
        }
    }
    None
}

/// Every way `plan` (the whole `EXPLAIN` text) reaches `table`, line by line.
pub fn accesses(plan: &str, table: &str) -> Vec<Access> {
    plan.lines()
        .filter_map(|line| access(line, table))
        .collect()
}

/// Whether `plan` scans `table` itself (not `<table>_held` or another table whose name
/// starts with it) sequentially or by bitmap heap scan.
pub fn scans_table(plan: &str, table: &str) -> bool {
    plan.lines().any(|line| {
        ["Seq Scan on ", "Bitmap Heap Scan on "].iter().any(|scan| {
            line.split(scan)
                .nth(1)
                .is_some_and(|rest| rest.split_whitespace().next() == Some(table))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_lines_are_read_for_the_named_table_only() {
        let plan = "Update on outbox\n  ->  Index Scan using outbox_pkey on outbox\n\
                    ->  Bitmap Index Scan on outbox_due\n  ->  Seq Scan on outbox_held h\n\
                    ->  Seq Scan on outbox o\n  ->  Tid Scan on outbox\n\
                    ->  Index Only Scan Backward using outbox_key on outbox";
        assert_eq!(
            accesses(plan, "outbox"),
            [
                Access::ByKey,
                Access::Index("outbox_due".to_owned()),
                Access::Scan("Seq Scan on outbox o".to_owned()),
                Access::ByKey,
                Access::Index("outbox_key".to_owned()),
            ]
        );
        assert_eq!(
            access("Tid Range Scan on outbox", "outbox"),
            Some(Access::Scan("Tid Range Scan on outbox".to_owned()))
        );
        assert_eq!(
            access("Index Scan using other_pkey on other", "outbox"),
            None
        );
    }

    #[test]
    fn scans_table_names_the_table_not_one_it_prefixes() {
        assert!(scans_table("  ->  Seq Scan on t m", "t"));
        assert!(scans_table("Bitmap Heap Scan on t", "t"));
        assert!(!scans_table("  ->  Seq Scan on t_held h", "t"));
        assert!(!scans_table("  ->  Index Scan using t_pkey on t", "t"));
    }
}
