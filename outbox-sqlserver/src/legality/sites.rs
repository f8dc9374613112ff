//! Where a statement names tables: each `WITH (<hints>)` list and the table reference
//! it follows, and whether that reference is a `FROM` table source or the target of an
//! `UPDATE`, `DELETE`, `INSERT` or `MERGE` (where the grammar allows only
//! `<table_hint_limited>`).

use super::catalog::object_name;
use super::lexer::{closing, Kind, Token};

/// The data-changing statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dml {
    Update,
    Delete,
    Insert,
    Merge,
}

impl Dml {
    fn of(t: &Token) -> Option<Dml> {
        match t.text.as_str() {
            "UPDATE" if t.kind == Kind::Word => Some(Dml::Update),
            "DELETE" if t.kind == Kind::Word => Some(Dml::Delete),
            "INSERT" if t.kind == Kind::Word => Some(Dml::Insert),
            "MERGE" if t.kind == Kind::Word => Some(Dml::Merge),
            _ => None,
        }
    }
}

/// Where a table reference stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// A table source of a `FROM` clause (or a `JOIN`, `USING`, ...).
    Source,
    /// The object a statement changes.
    Target(Dml),
}

/// One table hint: its keyword and, for `INDEX(...)`/`FORCESEEK(...)`, its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hint {
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
}

/// A `WITH (<hints>)` list and what it is attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HintList {
    pub(crate) hints: Vec<Hint>,
    pub(crate) place: Place,
    /// The object named (upper case, dot-joined), as written: a table or an alias.
    pub(crate) object: String,
    /// How the statement names its columns (`X` of `AS x`), if aliased.
    pub(crate) alias: Option<String>,
}

impl HintList {
    /// Whether the list holds the hint `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.hints.iter().any(|h| h.name == name)
    }
}

/// Every table hint keyword of the grammar (`<table_hint>` and `<table_hint_limited>`).
pub(crate) const TABLE_HINTS: &[&str] = &[
    "NOEXPAND",
    "INDEX",
    "FORCESEEK",
    "FORCESCAN",
    "HOLDLOCK",
    "NOLOCK",
    "NOWAIT",
    "PAGLOCK",
    "READCOMMITTED",
    "READCOMMITTEDLOCK",
    "READPAST",
    "READUNCOMMITTED",
    "REPEATABLEREAD",
    "ROWLOCK",
    "SERIALIZABLE",
    "SNAPSHOT",
    "SPATIAL_WINDOW_MAX_CELLS",
    "TABLOCK",
    "TABLOCKX",
    "UPDLOCK",
    "XLOCK",
    "KEEPIDENTITY",
    "KEEPDEFAULTS",
    "IGNORE_CONSTRAINTS",
    "IGNORE_TRIGGERS",
];

fn is_hint_word(t: &Token) -> bool {
    t.kind == Kind::Word && TABLE_HINTS.contains(&t.text.as_str())
}

/// Words that end a table reference rather than alias it.
const NOT_ALIASES: &[&str] = &[
    "WITH", "WHERE", "ON", "SET", "OUTPUT", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "JOIN",
    "FROM", "AS", "VALUES", "SELECT", "ORDER", "GROUP", "UNION", "OPTION", "USING", "INTO", "TOP",
    "PERCENT", "APPLY",
];

/// The hint lists of one statement, in order.
pub(crate) fn hint_lists(stmt: &[Token]) -> Vec<HintList> {
    let mut out = Vec::new();
    for w in 0..stmt.len() {
        if !(stmt[w].is("WITH")
            && stmt.get(w + 1).is_some_and(|t| t.is_punct("("))
            && stmt.get(w + 2).is_some_and(is_hint_word))
        {
            continue;
        }
        let close = closing(stmt, w + 1);
        let hints = parse_hints(&stmt[w + 2..close], stmt[w + 1].depth + 1);
        let (start, object, alias) = reference_before(stmt, w);
        out.push(HintList {
            hints,
            place: place_of(stmt, start),
            object,
            alias,
        });
    }
    out
}

/// Hint lists written without `WITH` right after a bracketed name: `[t] (NOLOCK)`.
pub(crate) fn bare_hint_lists(stmt: &[Token]) -> usize {
    stmt.windows(3)
        .filter(|w| w[0].kind == Kind::Quoted && w[1].is_punct("(") && is_hint_word(&w[2]))
        .count()
}

fn parse_hints(inside: &[Token], depth: usize) -> Vec<Hint> {
    inside
        .split(|t| t.is_punct(",") && t.depth == depth)
        .filter_map(|item| {
            let name = item.first()?.text.clone();
            let args = item
                .iter()
                .skip(1)
                .filter(|t| t.is_name() || t.kind == Kind::Num)
                .map(|t| t.text.clone())
                .collect();
            Some(Hint { name, args })
        })
        .collect()
}

/// The table reference ending before the `WITH` at `w`: its first token's index, the
/// object and the alias.
fn reference_before(stmt: &[Token], w: usize) -> (usize, String, Option<String>) {
    let mut j = w;
    let mut alias = None;
    let aliasable = |t: &Token| t.kind == Kind::Word && !NOT_ALIASES.contains(&t.text.as_str());
    // What can end an object name: a quoted name or a word that is not a keyword
    // standing before one (`UPDATE m WITH (...)` names `m`, it does not alias it).
    let ends_object = |t: &Token| t.kind == Kind::Quoted || (aliasable(t) && Dml::of(t).is_none());
    if j >= 2 && stmt[j - 2].is("AS") && stmt[j - 1].is_name() {
        alias = Some(stmt[j - 1].text.to_uppercase());
        j -= 2;
    } else if j >= 2 && aliasable(&stmt[j - 1]) && ends_object(&stmt[j - 2]) {
        alias = Some(stmt[j - 1].text.clone());
        j -= 1;
    }
    // Walk back over `a.b.c`.
    let mut start = j.saturating_sub(1);
    while start >= 2 && stmt[start - 1].is_punct(".") && stmt[start - 2].is_name() {
        start -= 2;
    }
    let (object, _) = object_name(stmt, start);
    (start, object, alias)
}

/// Skip back over a `TOP (<n>) [PERCENT]` ending just before `k`, returning the index
/// before it (or `k - 1` when there is none).
fn before_top(stmt: &[Token], k: usize) -> Option<usize> {
    let mut k = k.checked_sub(1)?;
    if stmt[k].is("PERCENT") {
        k = k.checked_sub(1)?;
    }
    if stmt[k].is_punct(")") {
        let open = (0..k)
            .rev()
            .find(|&o| stmt[o].is_punct("(") && stmt[o].depth == stmt[k].depth)?;
        if open >= 1 && stmt[open - 1].is("TOP") {
            return open.checked_sub(2);
        }
    }
    Some(k)
}

/// Whether the reference starting at `start` is a statement's target or a source.
fn place_of(stmt: &[Token], start: usize) -> Place {
    let Some(mut k) = start.checked_sub(1) else {
        return Place::Source;
    };
    let optional_keyword = stmt[k].is("FROM") || stmt[k].is("INTO");
    if optional_keyword {
        // `DELETE [TOP (n)] FROM <target>`, `INSERT [TOP (n)] INTO <target>`,
        // `MERGE [TOP (n)] INTO <target>`: the keyword belongs to the target. Any other
        // `FROM` opens a FROM clause.
        match before_top(stmt, k) {
            Some(b) => k = b,
            None => return Place::Source,
        }
    } else {
        match before_top(stmt, start) {
            Some(b) => k = b,
            None => return Place::Source,
        }
    }
    match Dml::of(&stmt[k]) {
        Some(dml) => Place::Target(dml),
        None => Place::Source,
    }
}

/// The statement's data-changing verb at its outermost level, with its index.
pub(crate) fn dml_verb(stmt: &[Token]) -> Option<(usize, Dml)> {
    let base = stmt.iter().map(|t| t.depth).min()?;
    stmt.iter()
        .enumerate()
        .filter(|(_, t)| t.depth == base)
        .find_map(|(i, t)| Dml::of(t).map(|d| (i, d)))
}

/// The base table a statement changes: its target, resolved through an alias of a
/// `FROM` occurrence or a CTE's first table (upper case, dot-joined).
pub(crate) fn target_table(stmt: &[Token]) -> Option<String> {
    let (verb, _) = dml_verb(stmt)?;
    let mut k = verb + 1;
    if stmt.get(k).is_some_and(|t| t.is("TOP")) {
        k = closing(stmt, k + 1) + 1;
    }
    if stmt.get(k).is_some_and(|t| t.is("FROM") || t.is("INTO")) {
        k += 1;
    }
    let (object, _) = object_name(stmt, k);
    if object.contains('.') {
        return Some(object);
    }
    // An alias: `<table> AS <alias>` or `<table> <alias>` elsewhere in the statement.
    for (i, t) in stmt.iter().enumerate() {
        if t.is_name() && t.text.to_uppercase() == object && i >= 1 {
            let before = if stmt[i - 1].is("AS") { i - 1 } else { i };
            if before >= 1 && stmt[before - 1].kind == Kind::Quoted {
                let mut s = before - 1;
                while s >= 2 && stmt[s - 1].is_punct(".") {
                    s -= 2;
                }
                let (table, _) = object_name(stmt, s);
                return Some(table);
            }
            // A CTE: `<name> AS (SELECT ... FROM <table> ...)`.
            if stmt.get(i + 1).is_some_and(|t| t.is("AS"))
                && stmt.get(i + 2).is_some_and(|t| t.is_punct("("))
            {
                let close = closing(stmt, i + 2);
                let from = (i + 3..close).find(|&f| stmt[f].is("FROM"))?;
                let (table, _) = object_name(stmt, from + 1);
                return Some(table);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::lexer::tokens;
    use super::*;

    fn lists(sql: &str) -> Vec<HintList> {
        hint_lists(&tokens(sql).unwrap())
    }

    #[test]
    fn hints_are_placed_on_targets_or_sources() {
        let cases = [
            (
                "DELETE TOP (@P1) FROM [s].[t] WITH (ROWLOCK) WHERE a = 1",
                Place::Target(Dml::Delete),
            ),
            (
                "DELETE FROM [s].[t] WITH (ROWLOCK)",
                Place::Target(Dml::Delete),
            ),
            ("DELETE [s].[t] WITH (ROWLOCK)", Place::Target(Dml::Delete)),
            (
                "DELETE TOP (1) x FROM [s].[t] AS x WITH (ROWLOCK)",
                Place::Source,
            ),
            (
                "UPDATE [s].[t] WITH (ROWLOCK) SET a = 1",
                Place::Target(Dml::Update),
            ),
            (
                "UPDATE TOP (5) [s].[t] WITH (ROWLOCK) SET a = 1",
                Place::Target(Dml::Update),
            ),
            (
                "UPDATE m SET a = 1 FROM [s].[t] AS m WITH (ROWLOCK)",
                Place::Source,
            ),
            (
                "INSERT INTO [s].[t] WITH (TABLOCK) (a) VALUES (1)",
                Place::Target(Dml::Insert),
            ),
            (
                "INSERT [s].[t] WITH (TABLOCK) (a) VALUES (1)",
                Place::Target(Dml::Insert),
            ),
            (
                "MERGE INTO [s].[t] WITH (HOLDLOCK) AS m USING x ON 1 = 1",
                Place::Target(Dml::Merge),
            ),
            (
                "SELECT 1 FROM [a].[b] AS o INNER JOIN [s].[t] c WITH (NOLOCK) ON 1 = 1",
                Place::Source,
            ),
        ];
        for (sql, place) in cases {
            let found = lists(sql);
            assert_eq!(found.last().map(|l| l.place), Some(place), "{sql}");
        }
        let aliased = lists("SELECT 1 FROM [s].[t] AS c WITH (INDEX([t_due]), FORCESEEK)");
        assert_eq!(aliased[0].object, "S.T");
        assert_eq!(aliased[0].alias.as_deref(), Some("C"));
        assert_eq!(aliased[0].hints[0].args, ["t_due"]);
        // Index options are not table hints.
        assert!(
            lists("ALTER INDEX [i] ON [s].[t] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)").is_empty()
        );
        assert!(lists("WITH due AS (SELECT 1 AS a) SELECT a FROM due").is_empty());
    }

    #[test]
    fn targets_resolve_through_aliases_and_ctes() {
        let target = |sql: &str| target_table(&tokens(sql).unwrap());
        assert_eq!(
            target("DELETE TOP (1) x FROM [s].[t] AS x WHERE 1 = 1").as_deref(),
            Some("S.T")
        );
        assert_eq!(
            target("UPDATE m SET a = 1 FROM [s].[t] m").as_deref(),
            Some("S.T")
        );
        assert_eq!(
            target("WITH due AS (SELECT TOP (1) * FROM [s].[t] AS c) UPDATE due SET a = 1")
                .as_deref(),
            Some("S.T")
        );
        assert_eq!(
            target("INSERT INTO [s].[t] (a) VALUES (1)").as_deref(),
            Some("S.T")
        );
        assert_eq!(target("SELECT 1").as_deref(), None);
    }
}
