//! An offline legality check of T-SQL: the rules of the T-SQL reference that the
//! server enforces when it compiles a batch and that a parser does not (`sqlparser`
//! accepts an index hint anywhere), each with the reference it comes from and the
//! error number the server answers with.
//!
//! The crate cannot run a SQL Server in CI, so every statement it can send is rendered
//! in `statement_tests` and checked here against the catalog its own DDL creates; each
//! rule is proven by a test that feeds it the form the server refuses
//! (`refused_tests`). The check reads tokens and parenthesis depth, not a full grammar:
//! it knows where a table hint list stands (a `FROM` table source or a statement's
//! target), which query an `ORDER BY` ends, what a filtered index's predicate is.
//!
//! What it cannot know (plans, lock counts, what a DBA added to the table after
//! install) is on the crate README's list of what to confirm first on a live server.

mod catalog;
mod lexer;
mod rules;
mod sites;

#[cfg(test)]
mod refused_tests;

pub(crate) use catalog::Catalog;
pub(crate) use rules::{check, Rule};
