//! Each rule proven on the form the server refuses, beside the form it accepts.

use super::{check, Catalog, Rule};

const DDL: &str = "CREATE TABLE [s].[t] (id binary(16) NOT NULL, seq bigint NOT NULL, \
    available_at datetime2 NOT NULL, dispatched_at datetime2 NULL, dead_at datetime2 NULL, \
    CONSTRAINT [t_pk] PRIMARY KEY NONCLUSTERED (id)); \
    CREATE INDEX [t_due] ON [s].[t] (available_at, seq) INCLUDE (id) \
    WHERE dispatched_at IS NULL AND dead_at IS NULL; \
    CREATE INDEX [t_dispatched] ON [s].[t] (dispatched_at) WHERE dispatched_at IS NOT NULL; \
    CREATE TABLE [s].[audited] (id int NOT NULL, CONSTRAINT [audited_pk] PRIMARY KEY (id)); \
    EXEC(N'CREATE TRIGGER [s].[audit] ON [s].[audited] AFTER UPDATE AS SELECT 1');";

fn rules_broken(sql: &str) -> Vec<Rule> {
    rules_at(sql, "READ COMMITTED")
}

fn rules_at(sql: &str, isolation: &str) -> Vec<Rule> {
    let catalog = Catalog::from_ddl(DDL).unwrap();
    let mut rules: Vec<Rule> = check(sql, 1, isolation, &catalog)
        .into_iter()
        .map(|v| v.rule)
        .collect();
    rules.dedup();
    rules
}

/// `refused` breaks exactly `rule`; `accepted` breaks nothing.
fn proven(rule: Rule, refused: &str, accepted: &str) {
    assert_eq!(rules_broken(refused), [rule], "refused: {refused}");
    assert_eq!(rules_broken(accepted), [], "accepted: {accepted}");
}

#[test]
fn index_hints_on_a_target_are_refused_1069() {
    proven(
        Rule::IndexHintOnTarget,
        "DELETE TOP (@P1) FROM [s].[t] WITH (INDEX([t_dispatched]), FORCESEEK, ROWLOCK, \
         READPAST, READCOMMITTEDLOCK) WHERE dispatched_at IS NOT NULL AND dispatched_at < @P2;",
        "DELETE TOP (@P1) x FROM [s].[t] AS x WITH (INDEX([t_dispatched]), FORCESEEK, ROWLOCK, \
         READPAST, READCOMMITTEDLOCK) WHERE x.dispatched_at IS NOT NULL AND x.dispatched_at < @P2;",
    );
    proven(
        Rule::IndexHintOnTarget,
        "UPDATE [s].[t] WITH (INDEX([t_pk]), FORCESEEK, ROWLOCK) SET seq = 1 WHERE id = @P1;",
        "UPDATE x SET seq = 1 FROM [s].[t] AS x WITH (INDEX([t_pk]), FORCESEEK, ROWLOCK) \
         WHERE x.id = @P1;",
    );
    proven(
        Rule::IndexHintOnTarget,
        "DELETE FROM [s].[t] WITH (FORCESCAN) WHERE id = @P1;",
        "DELETE FROM [s].[t] WITH (ROWLOCK) WHERE id = @P1;",
    );
    proven(
        Rule::IndexHintOnTarget,
        "INSERT INTO [s].[t] WITH (INDEX([t_pk])) (id) VALUES (@P1);",
        "INSERT INTO [s].[t] WITH (TABLOCK) (id) VALUES (@P1);",
    );
}

#[test]
fn target_hints_outside_the_limited_list_are_refused() {
    // 1065: NOLOCK / READUNCOMMITTED on a table being changed.
    proven(
        Rule::TargetHintNotAllowed,
        "UPDATE [s].[t] WITH (NOLOCK) SET seq = 1 WHERE id = @P1;",
        "UPDATE [s].[t] WITH (ROWLOCK) SET seq = 1 WHERE id = @P1;",
    );
    proven(
        Rule::TargetHintNotAllowed,
        "DELETE FROM [s].[t] WITH (READUNCOMMITTED) WHERE id = @P1;",
        "DELETE FROM [s].[t] WITH (UPDLOCK) WHERE id = @P1;",
    );
    // READPAST is not for an INSERT's target; READCOMMITTEDLOCK there is error 4140.
    proven(
        Rule::TargetHintNotAllowed,
        "INSERT INTO [s].[t] WITH (READCOMMITTEDLOCK) (id) VALUES (@P1);",
        "INSERT INTO [s].[t] (id) VALUES (@P1);",
    );
    assert!(
        rules_broken("INSERT INTO [s].[t] WITH (READPAST, UPDLOCK) (id) VALUES (@P1);")
            .contains(&Rule::TargetHintNotAllowed)
    );
}

#[test]
fn read_past_needs_a_locking_read_at_read_committed_650() {
    // Under READ_COMMITTED_SNAPSHOT a plain READPAST read is refused.
    proven(
        Rule::ReadPastIsolation,
        "SELECT id FROM [s].[t] WITH (READPAST, ROWLOCK) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) WHERE id = @P1;",
    );
    proven(
        Rule::ReadPastIsolation,
        "SELECT id FROM [s].[t] WITH (READPAST, UPDLOCK, HOLDLOCK) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (READPAST, UPDLOCK) WHERE id = @P1;",
    );
    proven(
        Rule::ReadPastIsolation,
        "SELECT id FROM [s].[t] WITH (READPAST, READCOMMITTED, UPDLOCK) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (READPAST, XLOCK) WHERE id = @P1;",
    );
    // The session's level counts, and a SET in the batch changes it.
    let locked = "SELECT id FROM [s].[t] WITH (READPAST, UPDLOCK) WHERE id = @P1;";
    assert_eq!(rules_at(locked, "SERIALIZABLE"), [Rule::ReadPastIsolation]);
    assert_eq!(rules_at(locked, "REPEATABLE READ"), []);
    assert_eq!(
        rules_broken(&format!(
            "SET TRANSACTION ISOLATION LEVEL SNAPSHOT; {locked}"
        )),
        [Rule::ReadPastIsolation]
    );
}

#[test]
fn two_hints_of_one_group_conflict_1047() {
    proven(
        Rule::ConflictingHints,
        "SELECT id FROM [s].[t] WITH (ROWLOCK, TABLOCK) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (ROWLOCK, UPDLOCK) WHERE id = @P1;",
    );
    proven(
        Rule::ConflictingHints,
        "SELECT id FROM [s].[t] WITH (INDEX([t_pk]), INDEX([t_dispatched])) \
         WHERE dispatched_at IS NOT NULL AND id = @P1;",
        "SELECT id FROM [s].[t] WITH (INDEX([t_pk])) WHERE id = @P1;",
    );
    proven(
        Rule::ConflictingHints,
        "SELECT id FROM [s].[t] WITH (FORCESEEK, FORCESCAN) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (FORCESEEK) WHERE id = @P1;",
    );
}

#[test]
fn a_hinted_index_must_exist_308() {
    proven(
        Rule::UnknownIndex,
        "SELECT id FROM [s].[t] WITH (INDEX([t_gone])) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (INDEX([t_pk])) WHERE id = @P1;",
    );
}

#[test]
fn a_hinted_filtered_index_needs_its_filter_stated_8622() {
    proven(
        Rule::FilterNotImplied,
        "SELECT TOP (1) c.id FROM [s].[t] AS c WITH (INDEX([t_due]), FORCESEEK) \
         WHERE c.dispatched_at IS NULL AND c.available_at <= SYSUTCDATETIME() ORDER BY c.seq;",
        "SELECT TOP (1) c.id FROM [s].[t] AS c WITH (INDEX([t_due]), FORCESEEK) \
         WHERE c.dispatched_at IS NULL AND c.dead_at IS NULL \
         AND c.available_at <= SYSUTCDATETIME() ORDER BY c.seq;",
    );
    // The filter is stated through the alias the hint's table has.
    assert_eq!(
        rules_broken(
            "SELECT c.id FROM [s].[t] AS c WITH (INDEX([t_dispatched])) \
             INNER JOIN [s].[t] AS o ON o.id = c.id WHERE o.dispatched_at IS NOT NULL;"
        ),
        [Rule::FilterNotImplied]
    );
}

#[test]
fn forceseek_needs_a_predicate_on_the_leading_key_8622() {
    proven(
        Rule::NoSeekPredicate,
        "SELECT x.id FROM [s].[t] AS x WITH (INDEX([t_due]), FORCESEEK) \
         WHERE x.dispatched_at IS NULL AND x.dead_at IS NULL AND x.seq = @P1;",
        "SELECT x.id FROM [s].[t] AS x WITH (INDEX([t_due]), FORCESEEK) \
         WHERE x.dispatched_at IS NULL AND x.dead_at IS NULL AND x.available_at < @P1;",
    );
    // Either side of an equality, and IN.
    for sql in [
        "SELECT 1 FROM [s].[t] AS m WITH (INDEX([t_pk]), FORCESEEK) INNER JOIN [s].[t] AS o ON o.seq = m.id;",
        "SELECT 1 FROM [s].[t] AS m WITH (INDEX([t_pk]), FORCESEEK) WHERE m.id IN (@P1, @P2);",
    ] {
        assert_eq!(rules_broken(sql), [], "{sql}");
    }
}

#[test]
fn order_by_and_top_where_the_grammar_allows_them() {
    // 156: UPDATE and DELETE have no ORDER BY.
    proven(
        Rule::TopOrderBy,
        "DELETE TOP (@P1) FROM [s].[t] WHERE id = @P2 ORDER BY seq;",
        "WITH d AS (SELECT TOP (@P1) * FROM [s].[t] WHERE id = @P2 ORDER BY seq) DELETE d;",
    );
    // 1033: ORDER BY in a CTE, derived table or subquery needs TOP or OFFSET.
    proven(
        Rule::TopOrderBy,
        "WITH d AS (SELECT * FROM [s].[t] ORDER BY seq) DELETE d;",
        "SELECT * FROM (SELECT * FROM [s].[t] ORDER BY seq OFFSET 0 ROWS) AS d;",
    );
    // TOP in a DML statement, and of a variable, is parenthesised.
    proven(
        Rule::TopOrderBy,
        "DELETE TOP 5 FROM [s].[t] WHERE id = @P1;",
        "DELETE TOP (5) FROM [s].[t] WHERE id = @P1;",
    );
    proven(
        Rule::TopOrderBy,
        "SELECT TOP @P1 id FROM [s].[t];",
        "SELECT TOP (@P1) id FROM [s].[t] ORDER BY id;",
    );
    // INSERT ... SELECT ... ORDER BY is allowed (it orders identity values).
    assert_eq!(
        rules_broken("INSERT INTO [s].[t] (id) SELECT b.id FROM (VALUES (1, @P1)) AS b(ord, id) ORDER BY b.ord;"),
        []
    );
}

#[test]
fn output_without_into_is_refused_on_a_table_with_a_trigger_334() {
    proven(
        Rule::OutputOnTriggeredTable,
        "UPDATE m SET id = 1 OUTPUT INSERTED.id FROM [s].[audited] AS m WHERE m.id = @P1;",
        "UPDATE m SET id = 1 OUTPUT INSERTED.id INTO @changed FROM [s].[audited] AS m WHERE m.id = @P1;",
    );
    // The same statement on a table without a trigger is fine.
    assert_eq!(
        rules_broken("UPDATE m SET seq = 1 OUTPUT INSERTED.id FROM [s].[t] AS m WHERE m.id = @P1;"),
        []
    );
}

#[test]
fn parameters_stay_within_one_request() {
    let catalog = Catalog::from_ddl(DDL).unwrap();
    let sql = "SELECT 1;";
    let too_many = check(sql, 2099, "READ COMMITTED", &catalog);
    assert_eq!(too_many.len(), 1);
    assert_eq!(too_many[0].rule, Rule::TooManyParameters);
    assert!(check(sql, 2098, "READ COMMITTED", &catalog).is_empty());
}

#[test]
fn hints_are_written_with_with() {
    proven(
        Rule::HintWithoutWith,
        "SELECT id FROM [s].[t] (NOLOCK) WHERE id = @P1;",
        "SELECT id FROM [s].[t] WITH (NOLOCK) WHERE id = @P1;",
    );
}

#[test]
fn dynamic_sql_is_checked_too() {
    assert_eq!(
        rules_broken("IF 1 = 1 EXEC(N'DELETE FROM [s].[t] WITH (INDEX([t_pk])) WHERE id = 1');"),
        [Rule::IndexHintOnTarget]
    );
    assert_eq!(rules_broken("SELECT 'unclosed;"), [Rule::Malformed]);
}

/// Forms that look like a broken rule to a careless reading and are legal: each keeps
/// a rule from firing where the server accepts the statement.
#[test]
fn legal_look_alikes_pass() {
    let locked = "SELECT id FROM [s].[t] WITH (READPAST, UPDLOCK) WHERE id = @P1;";
    for sql in [
        // A SET of a variable, and a column named `level`, set no isolation level.
        format!("DECLARE @x int; SET @x = 1; {locked}"),
        format!("SELECT 1 AS level; {locked}"),
        format!("SELECT x.isolation level FROM [s].[t] AS x; {locked}"),
        // GROUP BY is not ORDER BY, in a DML statement or in a subquery.
        "UPDATE m SET seq = 1 FROM [s].[t] AS m INNER JOIN (SELECT id FROM [s].[t] \
         GROUP BY id) AS g ON g.id = m.id;"
            .to_owned(),
        "SELECT * FROM (SELECT id FROM [s].[t] GROUP BY id) AS g;".to_owned(),
        // A window's ORDER BY is not a query's.
        "SELECT ROW_NUMBER() OVER (ORDER BY id) AS n FROM [s].[t];".to_owned(),
        // TOP after DISTINCT or ALL.
        "SELECT * FROM (SELECT DISTINCT TOP (5) id FROM [s].[t] ORDER BY id) AS d;".to_owned(),
        "SELECT * FROM (SELECT ALL TOP (5) id FROM [s].[t] ORDER BY id) AS d;".to_owned(),
        // No OUTPUT clause on a table with a trigger.
        "UPDATE m SET id = 1 FROM [s].[audited] AS m WHERE m.id = @P1;".to_owned(),
    ] {
        assert_eq!(rules_broken(&sql), [], "{sql}");
    }
    // A batch that sets READ COMMITTED makes READPAST legal whatever the session had.
    assert_eq!(
        rules_at(
            &format!("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; {locked}"),
            "SERIALIZABLE"
        ),
        []
    );
    // The level is read wherever the SET stands in its statement.
    assert_eq!(
        rules_broken(&format!(
            "IF 1 = 1 SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; {locked}"
        )),
        [Rule::ReadPastIsolation]
    );
}

#[test]
fn forceseek_needs_a_comparison_not_a_mention() {
    // The leading key in the select list is no seek predicate.
    assert_eq!(
        rules_broken(
            "SELECT x.available_at, x.id FROM [s].[t] AS x WITH (INDEX([t_due]), FORCESEEK) \
             WHERE x.dispatched_at IS NULL AND x.dead_at IS NULL AND x.seq = @P1;"
        ),
        [Rule::NoSeekPredicate]
    );
}

#[test]
fn violations_name_the_rule_and_the_statement() {
    let catalog = Catalog::from_ddl(DDL).unwrap();
    let found = check(
        "SELECT id FROM [s].[t] (NOLOCK) WHERE id = @P1;",
        1,
        "READ COMMITTED",
        &catalog,
    );
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].to_string(),
        "HintWithoutWith: SELECT ID FROM s . t ( NOLOCK ) WHERE ID = @P1"
    );
    // A long statement is cut, and says so.
    let long = format!(
        "SELECT id FROM [s].[t] (NOLOCK) WHERE id IN ({});",
        vec!["@P1"; 100].join(", ")
    );
    let detail = &check(&long, 1, "READ COMMITTED", &catalog)[0].detail;
    assert!(detail.ends_with("..."), "{detail}");
    assert_eq!(detail.chars().count(), 163);
}
