//! No row stops delivery (guarantee 12). Rows planted with SQL (as another tool would
//! write them) that do not make a deliverable message are dead-lettered by the claim
//! that meets them, with the reason, and the rest of the batch is delivered.

use std::time::Duration;

use outbox_core::store::MAX_ATTEMPTS;
use outbox_core::{
    store::ClaimRequest, store::OutboxStoreExt, DeadLetterFilter, DeadLetterPage, MessageId,
    OutboxAdmin, OutboxStore,
};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use uuid::Uuid;

use crate::{common, enqueue, msg, outbox, pg_outbox, table};

const LONG: Duration = Duration::from_secs(300);

/// One planted row: the SQL assignments that poison it and a fragment of the reason
/// it must be dead-lettered with.
struct Poison {
    what: &'static str,
    set: String,
    reason: &'static str,
}

fn poison(what: &'static str, set: impl Into<String>, reason: &'static str) -> Poison {
    Poison {
        what,
        set: set.into(),
        reason,
    }
}

/// Enqueue three good messages, then, due before them, one row per poison; claim
/// everything and check that the good ones come back (in order) and each poison row
/// is dead with its reason.
async fn check(outbox: &PgOutbox, poisons: &[Poison]) {
    let good: Vec<_> = (0..3).map(msg).collect();
    enqueue(outbox, &good).await;
    let t = table(outbox);
    let mut planted = Vec::new();
    for p in poisons {
        let id = MessageId::new();
        sqlx::query(&format!(
            "INSERT INTO {t} (id, destination, payload, available_at) \
             VALUES ($1, 'pg.tests', '\\x00', now() - interval '1 hour')"
        ))
        .bind(id.as_uuid())
        .execute(outbox.pool())
        .await
        .unwrap();
        sqlx::query(&format!("UPDATE {t} SET {} WHERE id = $1", p.set))
            .bind(id.as_uuid())
            .execute(outbox.pool())
            .await
            .unwrap_or_else(|e| panic!("planting {}: {e}", p.what));
        planted.push((id, p));
    }
    // Listing and counting never trip on them either.
    outbox.stats().await.unwrap();

    let claimed = outbox
        .claim(ClaimRequest::new(100, LONG).unwrap())
        .await
        .unwrap();
    let ids: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
    let expected: Vec<MessageId> = good.iter().map(|m| m.id()).collect();
    assert_eq!(ids, expected, "the good rows, in order, and nothing else");
    assert_eq!(
        claimed.dead_lettered,
        planted.len(),
        "the claim reports what it dead-lettered, for the relay to count"
    );

    let page = DeadLetterPage::new(DeadLetterFilter::default(), 100).unwrap();
    let dead = outbox.dead_letters(&page).await.unwrap();
    assert_eq!(dead.len(), planted.len());
    for (id, p) in &planted {
        let letter = dead
            .iter()
            .find(|d| d.message.id == *id)
            .unwrap_or_else(|| panic!("{} was not dead-lettered", p.what));
        let error = letter.message.last_error.as_deref().unwrap_or_default();
        assert!(
            error.contains(p.reason),
            "{}: last_error {error:?} should say {:?}",
            p.what,
            p.reason
        );
    }
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.in_flight, stats.dead),
        (0, 3, planted.len() as u64)
    );
    for c in &claimed {
        outbox.complete_one(&c.lease).await.unwrap();
    }
}

pg_test! {
    /// Timestamps PostgreSQL accepts but chrono cannot hold used to panic the
    /// relay while it decoded the claim.
    async fn out_of_range_timestamps_are_dead_lettered(
        (_, outbox) = pg_outbox("out-of-range timestamps", 2, PgOutboxConfig::default())
    ) {
        check(
            &outbox,
            &[
                poison(
                    "created_at infinity",
                    "created_at = 'infinity'",
                    "created_at infinity is outside",
                ),
                poison(
                    "created_at -infinity",
                    "created_at = '-infinity'",
                    "created_at -infinity is outside",
                ),
                poison(
                    "created_at in year 294000",
                    "created_at = '294000-01-01 00:00:00+00'",
                    "created_at 294000-01-01",
                ),
                poison(
                    "available_at -infinity",
                    "available_at = '-infinity'",
                    "available_at -infinity is outside",
                ),
                // Never due: claimed only because it lies past the decodable range.
                poison(
                    "available_at infinity",
                    "available_at = 'infinity'",
                    "available_at infinity is outside",
                ),
                poison(
                    "available_at in year 294000",
                    "available_at = '294000-01-01 00:00:00+00'",
                    "available_at 294000-01-01",
                ),
            ],
        )
        .await;
    }

    /// A claim incrementing `attempts` past `i32::MAX` failed with a numeric
    /// overflow, for every claim that met the row.
    async fn attempts_at_the_limit_are_dead_lettered(
        (_, outbox) = pg_outbox("attempts at the limit", 2, PgOutboxConfig::default())
    ) {
        let max = i64::from(MAX_ATTEMPTS);
        check(
            &outbox,
            &[
                poison(
                    "attempts at the limit",
                    format!("attempts = {max}"),
                    "reached the limit",
                ),
                poison(
                    "attempts one below the limit",
                    format!("attempts = {}", max - 1),
                    "reached the limit",
                ),
                poison("negative attempts", "attempts = -5", "attempts is -4"),
            ],
        )
        .await;
    }

    /// Rows that `enqueue` would refuse.
    async fn rows_enqueue_would_refuse_are_dead_lettered(
        (_, outbox) = pg_outbox("rows enqueue would refuse", 2, PgOutboxConfig::default())
    ) {
        check(
            &outbox,
            &[
                poison(
                    "empty destination",
                    "destination = ''",
                    "destination is empty",
                ),
                poison(
                    "destination with a newline",
                    "destination = E'a\\nb'",
                    "control character",
                ),
                poison(
                    "10 KB content type",
                    "content_type = repeat('c', 10000)",
                    "content type of 10000 bytes",
                ),
                poison(
                    "10 KB partition key",
                    "partition_key = repeat('k', 10000)",
                    "partition key of 10000 bytes",
                ),
                poison(
                    "header name with CR/LF",
                    r#"headers = '{"x-bad\r\nname": "v"}'::jsonb"#,
                    "header name",
                ),
                poison(
                    "headers not an object",
                    "headers = '[1, 2]'",
                    "headers are not a JSON object",
                ),
                poison(
                    "header value not a string",
                    r#"headers = '{"n": 1}'"#,
                    "is not a string",
                ),
            ],
        )
        .await;
    }

    /// The rules are the store's configured limits, the ones `enqueue` applies.
    async fn claims_apply_the_configured_limits(
        pool = common::connect("claims apply the configured limits", 2)
    ) {
        let limits = outbox_core::MessageLimits::default().with_max_payload_bytes(64);
        let outbox = outbox(&pool, PgOutboxConfig::default().with_limits(limits)).await;
        check(
            &outbox,
            &[poison(
                "payload over this outbox's limit",
                "payload = decode(repeat('ab', 65), 'hex')",
                "payload of 65 bytes exceeds the limit of 64",
            )],
        )
        .await;
        // The planted rows are listed with what decodes: here nothing is out of range.
        let stored: Vec<Uuid> = sqlx::query_scalar(&format!(
            "SELECT id FROM {} WHERE dead_at IS NOT NULL",
            table(&outbox)
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(stored.len(), 1);
    }
}
