//! The rules, each with the T-SQL reference page it is taken from and the error the
//! server raises when a batch breaks it.

use std::fmt;

use super::catalog::{dynamic_sql, Catalog, Index};
use super::lexer::{closing, statements, tokens, Kind, Token};
use super::sites::{bare_hint_lists, dml_verb, hint_lists, target_table, Dml, HintList, Place};

/// One rule of the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The text does not tokenize (an unclosed string, bracket or parenthesis).
    Malformed,
    /// `INDEX(..)`, `FORCESEEK`, `FORCESCAN` and `NOEXPAND` on the target of an
    /// `UPDATE`/`DELETE`/`INSERT`/`MERGE`. UPDATE, DELETE, INSERT and MERGE
    /// (Transact-SQL) allow only `WITH (<table_hint_limited>)` on the target, and
    /// "Table Hints (Transact-SQL)" lists no index hint there: error 1069, "Index hints
    /// are only allowed in a FROM or OPTION clause".
    IndexHintOnTarget,
    /// A target hint outside `<table_hint_limited>`, or one the reference forbids on
    /// that target: `NOLOCK`/`READUNCOMMITTED` on a table being changed (error 1065),
    /// `READPAST` on an `INSERT`'s target ("can't be specified for tables in the INTO
    /// clause"), `READCOMMITTEDLOCK` on an `INSERT`'s target (error 4140).
    TargetHintNotAllowed,
    /// `READPAST` where its isolation rules fail ("Table Hints", READPAST): only at
    /// READ COMMITTED or REPEATABLE READ (error 650 otherwise, so never with
    /// `NOLOCK`, `READUNCOMMITTED`, `HOLDLOCK`, `SERIALIZABLE`, `SNAPSHOT` in the list
    /// or another session level); and since it "can't be specified when the
    /// READ_COMMITTED_SNAPSHOT database option is set to ON" at READ COMMITTED unless
    /// the read takes locks, only with `READCOMMITTEDLOCK` (or `UPDLOCK`/`XLOCK`,
    /// which lock whatever the option says), never with `READCOMMITTED`.
    ReadPastIsolation,
    /// Two hints of one group on one table ("Table Hints", Remarks: one granularity
    /// hint of `PAGLOCK`, `NOLOCK`, `ROWLOCK`, `TABLOCK`, `TABLOCKX`; one isolation
    /// hint of `HOLDLOCK`, `NOLOCK`, `READCOMMITTED`, `REPEATABLEREAD`,
    /// `SERIALIZABLE`; "Only one index hint per table"; `FORCESEEK` never with
    /// `FORCESCAN`): error 1047, conflicting locking hints. The page also lists
    /// `READCOMMITTEDLOCK` among the granularity hints; `ROWLOCK, READPAST,
    /// READCOMMITTEDLOCK` is the receive statement widely deployed queue transports
    /// run, so this rule does not count it (it is on the confirm-first list).
    ConflictingHints,
    /// An index hint naming an index the crate's DDL does not create on that table:
    /// error 308 ("Index ... on table ... (specified in the FROM clause) does not
    /// exist").
    UnknownIndex,
    /// A filtered index hinted by a statement that does not state the index's filter:
    /// "Table Hints", Filtered index hints: error 8622 if the index "doesn't cover all
    /// of the rows that the query selects".
    FilterNotImplied,
    /// `FORCESEEK` with an index whose leading key the statement never compares: "If
    /// FORCESEEK causes no plan to be found, error 8622 is returned".
    NoSeekPredicate,
    /// `ORDER BY` in an `UPDATE`/`DELETE` (their grammar has none; error 156), or in a
    /// derived table, subquery or CTE without `TOP` or `OFFSET` (SELECT - ORDER BY
    /// Clause: error 1033), or a `TOP` whose expression is not parenthesised where the
    /// reference requires it (TOP (Transact-SQL): in INSERT, UPDATE, MERGE and DELETE,
    /// and for a variable).
    TopOrderBy,
    /// `OUTPUT` without `INTO` on a table with an enabled trigger (OUTPUT Clause:
    /// error 334, "The target table ... of the DML statement cannot have any enabled
    /// triggers if the statement contains an OUTPUT clause without INTO clause").
    OutputOnTriggeredTable,
    /// More parameters than one request takes: "Maximum capacity specifications for
    /// SQL Server", parameters per stored procedure 2,100, and `sp_executesql` spends
    /// two on the statement and the parameter list (error 8003).
    TooManyParameters,
    /// A table hint list without `WITH` (`[t] (NOLOCK)`): "Table Hints", omitting WITH
    /// is deprecated, and alone-only for most hints.
    HintWithoutWith,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) rule: Rule,
    pub(crate) detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.rule, self.detail)
    }
}

/// The most parameters one `sp_executesql` request binds (2,100 less its own two).
pub(crate) const MAX_BOUND_PARAMS: usize = 2098;

/// Every rule `sql` (bound with `params` parameters, run in a session at
/// `isolation`, e.g. `READ COMMITTED`) breaks against the tables of `catalog`.
pub(crate) fn check(
    sql: &str,
    params: usize,
    isolation: &str,
    catalog: &Catalog,
) -> Vec<Violation> {
    let mut out = Vec::new();
    if params > MAX_BOUND_PARAMS {
        out.push(violation(
            Rule::TooManyParameters,
            format!("{params} parameters, at most {MAX_BOUND_PARAMS}"),
        ));
    }
    match tokens(sql) {
        Ok(all) => check_batch(&all, isolation.to_owned(), catalog, &mut out),
        Err(e) => out.push(violation(Rule::Malformed, e.0)),
    }
    out
}

fn violation(rule: Rule, detail: impl Into<String>) -> Violation {
    Violation {
        rule,
        detail: detail.into(),
    }
}

fn check_batch(all: &[Token], mut isolation: String, catalog: &Catalog, out: &mut Vec<Violation>) {
    for stmt in statements(all) {
        if let Some(level) = isolation_set(stmt) {
            isolation = level;
        }
        for text in dynamic_sql(stmt) {
            match tokens(&text) {
                Ok(inner) => check_batch(&inner, isolation.clone(), catalog, out),
                Err(e) => out.push(violation(Rule::Malformed, e.0)),
            }
        }
        if bare_hint_lists(stmt) > 0 {
            out.push(violation(Rule::HintWithoutWith, text_of(stmt)));
        }
        for list in hint_lists(stmt) {
            target_hints(&list, out);
            read_past(&list, &isolation, out);
            conflicts(&list, out);
            indexes(stmt, &list, catalog, out);
        }
        top_and_order(stmt, out);
        output_clause(stmt, catalog, out);
    }
}

/// `SET TRANSACTION ISOLATION LEVEL <level>`: the level, upper case.
fn isolation_set(stmt: &[Token]) -> Option<String> {
    let at = stmt.windows(4).position(|w| {
        w[0].is("SET") && w[1].is("TRANSACTION") && w[2].is("ISOLATION") && w[3].is("LEVEL")
    })?;
    let level: Vec<&str> = stmt[at + 4..]
        .iter()
        .take_while(|t| t.kind == Kind::Word)
        .map(|t| t.text.as_str())
        .collect();
    Some(level.join(" "))
}

fn text_of(stmt: &[Token]) -> String {
    let words: Vec<&str> = stmt.iter().map(|t| t.text.as_str()).collect();
    let text = words.join(" ");
    match text.char_indices().nth(160) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

const LIMITED: &[&str] = &[
    "KEEPIDENTITY",
    "KEEPDEFAULTS",
    "HOLDLOCK",
    "IGNORE_CONSTRAINTS",
    "IGNORE_TRIGGERS",
    "NOLOCK",
    "NOWAIT",
    "PAGLOCK",
    "READCOMMITTED",
    "READCOMMITTEDLOCK",
    "READPAST",
    "REPEATABLEREAD",
    "ROWLOCK",
    "SERIALIZABLE",
    "SNAPSHOT",
    "TABLOCK",
    "TABLOCKX",
    "UPDLOCK",
    "XLOCK",
];

const INDEX_HINTS: &[&str] = &["INDEX", "FORCESEEK", "FORCESCAN", "NOEXPAND"];

fn target_hints(list: &HintList, out: &mut Vec<Violation>) {
    let Place::Target(dml) = list.place else {
        return;
    };
    for hint in &list.hints {
        let name = hint.name.as_str();
        let refused = if INDEX_HINTS.contains(&name) {
            Some(Rule::IndexHintOnTarget)
        } else if !LIMITED.contains(&name)
            || name == "NOLOCK"
            || (dml == Dml::Insert && (name == "READPAST" || name == "READCOMMITTEDLOCK"))
        {
            Some(Rule::TargetHintNotAllowed)
        } else {
            None
        };
        if let Some(rule) = refused {
            out.push(violation(
                rule,
                format!("{name} on the {dml:?} target {}", list.object),
            ));
        }
    }
}

fn read_past(list: &HintList, isolation: &str, out: &mut Vec<Violation>) {
    if !list.has("READPAST") {
        return;
    }
    let on = &list.object;
    if !["READ COMMITTED", "REPEATABLE READ"].contains(&isolation) {
        out.push(violation(
            Rule::ReadPastIsolation,
            format!("READPAST on {on} in a session at {isolation}"),
        ));
    }
    for other in [
        "NOLOCK",
        "READUNCOMMITTED",
        "HOLDLOCK",
        "SERIALIZABLE",
        "SNAPSHOT",
        "READCOMMITTED",
    ] {
        if list.has(other) {
            out.push(violation(
                Rule::ReadPastIsolation,
                format!("READPAST with {other} on {on}"),
            ));
        }
    }
    if !["READCOMMITTEDLOCK", "UPDLOCK", "XLOCK"]
        .iter()
        .any(|h| list.has(h))
    {
        out.push(violation(
            Rule::ReadPastIsolation,
            format!("READPAST on {on} without READCOMMITTEDLOCK, UPDLOCK or XLOCK"),
        ));
    }
}

fn conflicts(list: &HintList, out: &mut Vec<Violation>) {
    let groups: [(&str, &[&str]); 4] = [
        (
            "granularity",
            &["PAGLOCK", "NOLOCK", "ROWLOCK", "TABLOCK", "TABLOCKX"],
        ),
        (
            "isolation",
            &[
                "HOLDLOCK",
                "NOLOCK",
                "READCOMMITTED",
                "REPEATABLEREAD",
                "SERIALIZABLE",
                "READUNCOMMITTED",
            ],
        ),
        ("index", &["INDEX"]),
        ("access", &["FORCESEEK", "FORCESCAN"]),
    ];
    for (group, members) in groups {
        let n = list
            .hints
            .iter()
            .filter(|h| members.contains(&h.name.as_str()))
            .count();
        if n > 1 {
            out.push(violation(
                Rule::ConflictingHints,
                format!("{n} {group} hints on {}", list.object),
            ));
        }
    }
}

/// The index hints of `list`, against the indexes `catalog` knows of its table.
fn indexes(stmt: &[Token], list: &HintList, catalog: &Catalog, out: &mut Vec<Violation>) {
    let table = &list.object;
    if !catalog.knows(table) {
        return;
    }
    let forceseek = list.has("FORCESEEK");
    for hint in list.hints.iter().filter(|h| h.name == "INDEX") {
        for name in &hint.args {
            let Some(index) = catalog.index_of(table, name) else {
                out.push(violation(Rule::UnknownIndex, format!("{name} on {table}")));
                continue;
            };
            for conjunct in &index.filter {
                if !mentions(stmt, list.alias.as_deref(), conjunct) {
                    out.push(violation(
                        Rule::FilterNotImplied,
                        format!(
                            "{name}'s filter term `{}` is not stated",
                            conjunct.join(" ")
                        ),
                    ));
                }
            }
            if forceseek && !seeks(stmt, list.alias.as_deref(), index) {
                out.push(violation(
                    Rule::NoSeekPredicate,
                    format!(
                        "FORCESEEK on {name}, whose leading key {} is never compared",
                        index.keys[0]
                    ),
                ));
            }
        }
    }
}

/// The positions where `stmt` names `column` (upper case): `alias.column`, or a bare
/// `column` when the table has no alias.
fn column_at(stmt: &[Token], alias: Option<&str>, column: &str) -> Vec<usize> {
    (0..stmt.len())
        .filter(|&i| stmt[i].is_name() && stmt[i].text.to_uppercase() == column)
        .filter(|&i| {
            let dotted = i >= 2 && stmt[i - 1].is_punct(".");
            match alias {
                Some(a) => dotted && stmt[i - 2].text.to_uppercase() == a,
                None => !dotted,
            }
        })
        .collect()
}

/// Whether `stmt` states `conjunct` (`COL IS NULL`) of the table aliased `alias`.
fn mentions(stmt: &[Token], alias: Option<&str>, conjunct: &[String]) -> bool {
    let Some((column, rest)) = conjunct.split_first() else {
        return true;
    };
    column_at(stmt, alias, column).into_iter().any(|i| {
        rest.iter().enumerate().all(|(k, word)| {
            stmt.get(i + 1 + k)
                .is_some_and(|t| t.text.to_uppercase() == *word)
        })
    })
}

/// Whether `stmt` compares the leading key of `index` (`= < <= > >= IN`, either side).
fn seeks(stmt: &[Token], alias: Option<&str>, index: &Index) -> bool {
    const CMP: &[&str] = &["=", "<", "<=", ">", ">="];
    column_at(stmt, alias, &index.keys[0]).into_iter().any(|i| {
        let after = stmt.get(i + 1);
        // Before `alias.column` (or the bare column).
        let start = if alias.is_some() { i - 2 } else { i };
        let before = start.checked_sub(1).and_then(|b| stmt.get(b));
        after.is_some_and(|t| {
            (t.kind == Kind::Punct && CMP.contains(&t.text.as_str())) || t.is("IN")
        }) || before.is_some_and(|t| t.is_punct("="))
    })
}

fn top_and_order(stmt: &[Token], out: &mut Vec<Violation>) {
    let Some(base) = stmt.iter().map(|t| t.depth).min() else {
        return;
    };
    if let Some((verb, dml)) = dml_verb(stmt) {
        let order = (verb..stmt.len().saturating_sub(1))
            .any(|i| stmt[i].depth == base && stmt[i].is("ORDER") && stmt[i + 1].is("BY"));
        if order && matches!(dml, Dml::Update | Dml::Delete) {
            out.push(violation(
                Rule::TopOrderBy,
                format!("ORDER BY in a {dml:?}"),
            ));
        }
        if stmt.get(verb + 1).is_some_and(|t| t.is("TOP"))
            && !stmt.get(verb + 2).is_some_and(|t| t.is_punct("("))
        {
            out.push(violation(
                Rule::TopOrderBy,
                format!("TOP without parentheses in a {dml:?}"),
            ));
        }
    }
    for i in 0..stmt.len() {
        if stmt[i].is("TOP") && stmt.get(i + 1).is_some_and(|t| t.kind == Kind::Var) {
            out.push(violation(
                Rule::TopOrderBy,
                "TOP of a variable without parentheses",
            ));
        }
        // A query in parentheses: a derived table, a subquery, a CTE's body.
        if !(stmt[i].is_punct("(") && stmt.get(i + 1).is_some_and(|t| t.is("SELECT"))) {
            continue;
        }
        let depth = stmt[i].depth + 1;
        let close = closing(stmt, i);
        let body = &stmt[i + 1..close];
        let ordered = body
            .windows(2)
            .any(|w| w[0].depth == depth && w[0].is("ORDER") && w[1].is("BY"));
        let mut after_select = 1;
        while body
            .get(after_select)
            .is_some_and(|t| t.is("DISTINCT") || t.is("ALL"))
        {
            after_select += 1;
        }
        let topped = body.get(after_select).is_some_and(|t| t.is("TOP"))
            || body.iter().any(|t| t.depth == depth && t.is("OFFSET"));
        if ordered && !topped {
            out.push(violation(
                Rule::TopOrderBy,
                format!("ORDER BY without TOP or OFFSET in ({})", text_of(body)),
            ));
        }
    }
}

fn output_clause(stmt: &[Token], catalog: &Catalog, out: &mut Vec<Violation>) {
    let Some(base) = stmt.iter().map(|t| t.depth).min() else {
        return;
    };
    let Some(at) = stmt.iter().position(|t| t.depth == base && t.is("OUTPUT")) else {
        return;
    };
    let into = stmt[at + 1..]
        .iter()
        .filter(|t| t.depth == base)
        .take_while(|t| {
            !["FROM", "WHERE", "SELECT", "VALUES", "DEFAULT"]
                .iter()
                .any(|w| t.is(w))
        })
        .any(|t| t.is("INTO"));
    if into {
        return;
    }
    if let Some(table) = target_table(stmt) {
        if catalog.triggered.contains(&table) {
            out.push(violation(
                Rule::OutputOnTriggeredTable,
                format!("OUTPUT without INTO on {table}, which has a trigger"),
            ));
        }
    }
}
