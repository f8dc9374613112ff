//! What the legality rules need to know of the tables, read from the crate's own DDL:
//! each index's table, key columns and filter, and which tables carry triggers.

use super::lexer::{closing, statements, tokens, Kind, LexError, Token};

/// One index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Index {
    /// Its name, as `INDEX(...)` hints name it.
    pub(crate) name: String,
    /// Its table, `schema.table` in upper case.
    pub(crate) table: String,
    /// Its key columns, in order, upper case.
    pub(crate) keys: Vec<String>,
    /// The conjuncts of its filter (`WHERE a IS NULL AND b IS NULL`), each as its
    /// tokens' texts; empty for an unfiltered index.
    pub(crate) filter: Vec<Vec<String>>,
}

/// The indexes and triggers the DDL creates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Catalog {
    pub(crate) indexes: Vec<Index>,
    /// Tables (`schema.table`, upper case) with a trigger.
    pub(crate) triggered: Vec<String>,
    /// Tables the DDL creates.
    pub(crate) tables: Vec<String>,
}

impl Catalog {
    /// The catalog of the objects `ddl` creates (dynamic SQL in `EXEC(N'...')`
    /// included).
    pub(crate) fn from_ddl(ddl: &str) -> Result<Catalog, LexError> {
        let mut catalog = Catalog::default();
        catalog.read(&tokens(ddl)?)?;
        Ok(catalog)
    }

    fn read(&mut self, all: &[Token]) -> Result<(), LexError> {
        for stmt in statements(all) {
            for text in dynamic_sql(stmt) {
                self.read(&tokens(&text)?)?;
            }
            let Some(create) = stmt.iter().position(|t| t.is("CREATE")) else {
                continue;
            };
            let rest = &stmt[create + 1..];
            let mut k = 0;
            while rest
                .get(k)
                .is_some_and(|t| t.is("UNIQUE") || t.is("CLUSTERED") || t.is("NONCLUSTERED"))
            {
                k += 1;
            }
            match rest.get(k).map(|t| t.text.as_str()) {
                Some("INDEX") => self.index(&rest[k + 1..]),
                Some("TABLE") => self.table(&rest[k + 1..]),
                Some("TRIGGER") => {
                    if let Some(on) = rest.iter().position(|t| t.is("ON")) {
                        let (table, _) = object_name(rest, on + 1);
                        self.triggered.push(table);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `[name] ON [s].[t] (keys) [INCLUDE (..)] [WHERE filter]`.
    fn index(&mut self, rest: &[Token]) {
        let Some(name) = rest.first().map(|t| t.text.clone()) else {
            return;
        };
        let Some(on) = rest.iter().position(|t| t.is("ON")) else {
            return;
        };
        let (table, after) = object_name(rest, on + 1);
        let keys = column_list(rest, after);
        let filter = rest
            .iter()
            .position(|t| t.is("WHERE"))
            .map(|w| conjuncts(&rest[w + 1..]))
            .unwrap_or_default();
        self.indexes.push(Index {
            name,
            table,
            keys,
            filter,
        });
    }

    /// `[s].[t] (columns, CONSTRAINT [name] PRIMARY KEY [NONCLUSTERED] (keys))`.
    fn table(&mut self, rest: &[Token]) {
        let (table, after) = object_name(rest, 0);
        self.tables.push(table.clone());
        let mut k = after;
        while k < rest.len() {
            if rest[k].is("CONSTRAINT")
                && rest.get(k + 2).is_some_and(|t| t.is("PRIMARY"))
                && rest.get(k + 3).is_some_and(|t| t.is("KEY"))
            {
                let mut open = k + 4;
                while rest.get(open).is_some_and(|t| !t.is_punct("(")) {
                    open += 1;
                }
                self.indexes.push(Index {
                    name: rest[k + 1].text.clone(),
                    table: table.clone(),
                    keys: column_list(rest, open),
                    filter: Vec::new(),
                });
            }
            k += 1;
        }
    }

    /// The index `name` of `table`, if the DDL creates it.
    pub(crate) fn index_of(&self, table: &str, name: &str) -> Option<&Index> {
        self.indexes
            .iter()
            .find(|i| i.table == table && i.name.eq_ignore_ascii_case(name))
    }

    /// Whether the DDL creates `table`.
    pub(crate) fn knows(&self, table: &str) -> bool {
        self.tables.iter().any(|t| t == table)
    }
}

/// The texts of the `EXEC(N'...')` / `EXEC(N'...')` strings in `stmt`: dynamic SQL the
/// server compiles when it runs.
pub(crate) fn dynamic_sql(stmt: &[Token]) -> Vec<String> {
    stmt.windows(3)
        .filter(|w| {
            (w[0].is("EXEC") || w[0].is("EXECUTE")) && w[1].is_punct("(") && w[2].kind == Kind::Str
        })
        .map(|w| w[2].text.clone())
        .collect()
}

/// The object name starting at `from` (`[s].[t]`, `t`), upper case and dot-joined, and
/// the index after it.
pub(crate) fn object_name(toks: &[Token], from: usize) -> (String, usize) {
    let mut parts = Vec::new();
    let mut k = from;
    while let Some(t) = toks.get(k).filter(|t| t.is_name()) {
        parts.push(t.text.to_uppercase());
        if toks.get(k + 1).is_some_and(|t| t.is_punct(".")) {
            k += 2;
        } else {
            k += 1;
            break;
        }
    }
    (parts.join("."), k)
}

/// The names in the parenthesised list opening at `open` (each item's first name,
/// `ASC`/`DESC` dropped), upper case.
fn column_list(toks: &[Token], open: usize) -> Vec<String> {
    if !toks.get(open).is_some_and(|t| t.is_punct("(")) {
        return Vec::new();
    }
    let close = closing(toks, open);
    toks[open + 1..close]
        .split(|t| t.is_punct(",") && t.depth == toks[open].depth + 1)
        .filter_map(|item| item.first().map(|t| t.text.to_uppercase()))
        .collect()
}

/// A predicate split at its top-level `AND`s, each conjunct as token texts.
pub(crate) fn conjuncts(pred: &[Token]) -> Vec<Vec<String>> {
    let Some(base) = pred.first().map(|t| t.depth) else {
        return Vec::new();
    };
    let end = pred
        .iter()
        .position(|t| t.depth < base || (t.depth == base && t.is("WITH")))
        .unwrap_or(pred.len());
    pred[..end]
        .split(|t| t.is("AND") && t.depth == base)
        .map(|c| c.iter().map(|t| t.text.to_uppercase()).collect())
        .filter(|c: &Vec<String>| !c.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_keys_filters_and_triggers_come_from_the_ddl() {
        let ddl = "IF OBJECT_ID(N'[s].[t]', N'U') IS NULL CREATE TABLE [s].[t] (id int NOT NULL, \
                   CONSTRAINT [t_pk] PRIMARY KEY NONCLUSTERED (id)); \
                   IF 1 = 1 CREATE INDEX [t_due] ON [s].[t] (available_at, seq) INCLUDE (id) \
                   WHERE dispatched_at IS NULL AND dead_at IS NULL; \
                   EXEC(N'CREATE TRIGGER [tr] ON [s].[t] AFTER INSERT AS SELECT 1');";
        let c = Catalog::from_ddl(ddl).unwrap();
        assert_eq!(c.tables, ["S.T"]);
        let pk = c.index_of("S.T", "t_pk").unwrap();
        assert_eq!(pk.keys, ["ID"]);
        assert!(pk.filter.is_empty());
        let due = c.index_of("S.T", "T_DUE").unwrap();
        assert_eq!(due.keys, ["AVAILABLE_AT", "SEQ"]);
        assert_eq!(
            due.filter,
            [
                vec!["DISPATCHED_AT", "IS", "NULL"],
                vec!["DEAD_AT", "IS", "NULL"]
            ]
        );
        assert_eq!(c.triggered, ["S.T"]);
        assert!(c.index_of("S.T", "t_gone").is_none());
    }
}
