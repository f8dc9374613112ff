#![doc = include_str!("../README.md")]

mod admin;
mod claim;
mod config;
mod connect;
mod dedup;
mod entity;
mod error;
mod exec;
mod ident;
mod install;
mod lock;
mod row;
mod schema;
mod session;
mod showplan;
mod sql;
mod store;

#[cfg(test)]
mod hint_tests;
#[cfg(test)]
mod legality;
#[cfg(test)]
mod registry_tests;
#[cfg(test)]
mod statement_tests;

pub use config::{MssqlDedupConfig, MssqlEntityConfig, MssqlOutboxConfig, MAX_PARTITION_KEY_LEN};
pub use connect::MssqlConnection;
pub use dedup::MssqlDedupStore;
pub use entity::MssqlEntityStore;
pub use ident::{MssqlRules, QualifiedName};
pub use lock::MssqlDistributedLock;
pub use schema::SCHEMA_VERSION;
pub use session::{
    MssqlClient, MssqlManager, MssqlPool, MssqlSession, MssqlTransaction, DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
};
pub use store::MssqlOutbox;

#[doc(hidden)]
pub use showplan::{accesses as showplan_accesses, Explained, PlanAccess};

/// The tiberius this crate was built with: run your transactions on its `Client`.
pub use tiberius;

// Compile-time checks (tests only) that the public futures can be spawned on a
// multi-threaded runtime.
outbox_core::backend::backend_send_checks! {
    outbox: MssqlOutbox, dedup: MssqlDedupStore, conn: &mut MssqlClient;

    fn transactions_are_send(session: &mut MssqlSession, tx: MssqlTransaction<'_>) {
        assert_send(session.begin());
        assert_send(tx.commit());
    }
}
