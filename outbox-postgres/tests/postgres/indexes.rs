//! The indexes each configuration installs: `<table>_key` only under per-key order,
//! added by a per-key install to a table an unordered one installed (which per-key
//! claims then read), left alone by an unordered install, and found in the catalog
//! without waiting for the table's writers.

use outbox_core::{store::ClaimRequest, store::OutboxStoreExt, ErrorKind, KeyOrder, OutboxStore};
use outbox_postgres::{PgOutbox, PgOutboxConfig};

use crate::ordering::{keyed, per_key, LONG};
use crate::plans::{claim_statement, explain, no_autovacuum, settle_args, Plan};
use crate::{common, enqueue, outbox, pg_outbox, table};

const UNORDERED: [&str; 4] = [
    "outbox_messages_dead",
    "outbox_messages_dispatched",
    "outbox_messages_due",
    "outbox_messages_pkey",
];
const PER_KEY: [&str; 5] = [
    "outbox_messages_dead",
    "outbox_messages_dispatched",
    "outbox_messages_due",
    "outbox_messages_key",
    "outbox_messages_pkey",
];

/// The valid indexes of `outbox`'s table, by name.
async fn indexes(outbox: &PgOutbox) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid \
         WHERE i.indrelid = $1::regclass AND i.indisvalid ORDER BY 1",
    )
    .bind(table(outbox))
    .fetch_all(outbox.pool())
    .await
    .unwrap()
}

/// Another outbox on `outbox`'s table, claiming in `ordering`.
fn on_same_table(outbox: &PgOutbox, ordering: KeyOrder) -> PgOutbox {
    let config = outbox.config().clone().with_ordering(ordering);
    PgOutbox::new(outbox.pool().clone(), config).unwrap()
}

pg_test! {
    async fn each_ordering_installs_the_indexes_it_reads(
        (pool, unordered) = pg_outbox("indexes per ordering", 2, PgOutboxConfig::default())
    ) {
        assert_eq!(indexes(&unordered).await, UNORDERED);
        let ordered = outbox(&pool, per_key()).await;
        assert_eq!(indexes(&ordered).await, PER_KEY);

        // The DDL a migration tool would apply installs the same indexes.
        for (config, expected) in [
            (PgOutboxConfig::default(), &UNORDERED[..]),
            (per_key(), &PER_KEY[..]),
        ] {
            let config = config.with_schema(common::schema_name());
            let outbox = PgOutbox::new(pool.clone(), config).unwrap();
            sqlx::raw_sql(&outbox.ddl()).execute(&pool).await.unwrap();
            assert_eq!(indexes(&outbox).await, expected);
        }
    }

    /// A per-key outbox installed over a table an unordered one installed (with messages
    /// in it) adds the key index, keeps the layout version, claims in key order, and its
    /// claim reads the index on a table bulk-loaded without statistics; an unordered
    /// install afterwards leaves the index alone.
    async fn a_per_key_install_adds_the_key_index_to_an_unordered_table(
        (pool, unordered) = pg_outbox(
            "per-key install over an unordered table",
            2,
            PgOutboxConfig::default(),
        )
    ) {
        no_autovacuum(&unordered).await;
        let batch = [keyed("a", 0), keyed("a", 1), keyed("b", 0)];
        enqueue(&unordered, &batch).await;

        let ordered = on_same_table(&unordered, KeyOrder::PerKey);
        ordered.install().await.unwrap();
        assert_eq!(indexes(&ordered).await, PER_KEY);
        let versions = format!(
            "SELECT table_name, version FROM \"{}\".outbox_schema_versions",
            ordered.config().schema()
        );
        let recorded: Vec<(String, i32)> =
            sqlx::query_as(&versions).fetch_all(&pool).await.unwrap();
        assert_eq!(recorded, [("outbox_messages".to_owned(), 1)]);
        ordered.install().await.unwrap();
        unordered.install().await.unwrap();
        assert_eq!(
            indexes(&ordered).await,
            PER_KEY,
            "an unordered install leaves the key index alone"
        );

        let heads = ordered
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        let ids: Vec<_> = heads.iter().map(|c| c.message.id).collect();
        assert_eq!(ids, [batch[0].id(), batch[2].id()], "the head of each key");
        // Nothing is claimable while the heads are in flight: capture the claim now.
        let claim = claim_statement(&ordered).await;
        let leases: Vec<_> = heads.iter().map(|c| c.lease).collect();
        assert_eq!(ordered.complete(&leases).await.unwrap().applied, 2);
        let next = ordered
            .claim(ClaimRequest::new(10, LONG).unwrap())
            .await
            .unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].message.id, batch[1].id());
        ordered.complete_one(&next[0].lease).await.unwrap();

        sqlx::query(&format!(
            "INSERT INTO {} (id, destination, partition_key, payload, available_at) \
             SELECT gen_random_uuid(), 'pg.tests', 'k' || (i % 1000), '\\x00', \
                 now() - interval '1 minute' \
             FROM generate_series(1, 100000) AS i",
            table(&ordered)
        ))
        .execute(&pool)
        .await
        .unwrap();
        let name = ordered.config().table();
        for plan in [Plan::Custom, Plan::Generic] {
            let text = explain(
                ordered.relay_pool(),
                &claim,
                |types| settle_args(types, &[]),
                plan,
            )
            .await;
            assert!(
                text.contains(&format!("{name}_key")) && !text.contains("Seq Scan"),
                "the per-key claim ({plan:?}) on the upgraded table must read the key index:\n{text}"
            );
        }
    }

    /// With every index present, install looks them up in the catalog and returns while
    /// another transaction has written to the table and not committed; `CREATE INDEX IF
    /// NOT EXISTS` alone would wait for that transaction (it takes the table's SHARE lock
    /// even when the index exists).
    async fn an_install_finding_its_indexes_does_not_wait_for_writers(
        (pool, ordered) = pg_outbox("install beside an open writer", 3, per_key())
    ) {
        let mut writer = pool.begin().await.unwrap();
        ordered
            .enqueue(&mut writer, &[keyed("a", 0)])
            .await
            .unwrap();
        for ordering in [KeyOrder::PerKey, KeyOrder::Unordered] {
            let install = on_same_table(&ordered, ordering);
            tokio::time::timeout(common::DEADLINE, install.install())
                .await
                .unwrap_or_else(|_| panic!("{ordering:?} install waited for the open writer"))
                .unwrap();
        }
        writer.rollback().await.unwrap();
    }

    /// An index left invalid by a failed `CREATE INDEX CONCURRENTLY` under the key index's
    /// name would be skipped by `IF NOT EXISTS`: install reports it instead, and creates
    /// the index once it is dropped.
    async fn an_invalid_key_index_is_a_schema_error(
        (pool, unordered) = pg_outbox("invalid key index", 2, PgOutboxConfig::default())
    ) {
        enqueue(&unordered, &[keyed("a", 0), keyed("a", 1)]).await;
        let schema = unordered.config().schema().to_owned();
        // Two rows share the destination, so the unique build fails and leaves the index
        // invalid.
        let failed = sqlx::raw_sql(&format!(
            "CREATE UNIQUE INDEX CONCURRENTLY outbox_messages_key ON {} (destination)",
            table(&unordered)
        ))
        .execute(&pool)
        .await;
        assert!(failed.is_err(), "the unique build must fail");

        let ordered = on_same_table(&unordered, KeyOrder::PerKey);
        let err = ordered.install().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema, "{err}");
        assert!(err.to_string().contains("is invalid"), "{err}");

        sqlx::raw_sql(&format!("DROP INDEX \"{schema}\".outbox_messages_key"))
            .execute(&pool)
            .await
            .unwrap();
        ordered.install().await.unwrap();
        assert_eq!(indexes(&ordered).await, PER_KEY);
    }
}
