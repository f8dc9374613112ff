//! Rows written straight into an outbox table that no `enqueue` would accept, and the
//! verdict on what a relay made of one of them.

use outbox_core::KeyOrder;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Sent, Worker};

/// The partition key of poison rows that do not bring their own: the first key the
/// normal messages use, so that under per-key order the poison heads that key.
pub(crate) const SHARED_KEY: &str = "key-000";

/// Longest `last_error` the store keeps, in bytes.
const MAX_ERROR_LEN: usize = outbox_core::store::MAX_ERROR_LEN;

/// One kind of poison row.
#[derive(Debug, Clone)]
pub(crate) struct Poison {
    /// A short name, also part of the trial's table name.
    pub(crate) name: &'static str,
    destination: String,
    /// `None`: [`SHARED_KEY`].
    key: Option<String>,
    content_type: Option<String>,
    /// JSON text.
    headers: &'static str,
    /// `timestamptz` text.
    created_at: &'static str,
    /// `timestamptz` text.
    available_at: &'static str,
    attempts: i32,
}

impl Poison {
    fn new(name: &'static str) -> Self {
        Poison {
            name,
            destination: "chaos.poison".to_owned(),
            key: None,
            content_type: None,
            headers: "{}",
            created_at: "now",
            available_at: "now",
            attempts: 0,
        }
    }
}

/// Every kind planted by the poison test.
pub(crate) fn kinds() -> Vec<Poison> {
    // Past chrono's last year (262143), inside PostgreSQL's (294276).
    let far = "294000-01-01 00:00:00+00";
    vec![
        Poison {
            created_at: "infinity",
            ..Poison::new("created_inf")
        },
        Poison {
            created_at: "-infinity",
            ..Poison::new("created_neg_inf")
        },
        Poison {
            created_at: far,
            ..Poison::new("created_294000")
        },
        Poison {
            available_at: "infinity",
            ..Poison::new("available_inf")
        },
        Poison {
            available_at: far,
            ..Poison::new("available_294000")
        },
        Poison {
            available_at: "-infinity",
            ..Poison::new("available_neg_inf")
        },
        Poison {
            attempts: i32::MAX,
            ..Poison::new("attempts_max")
        },
        Poison {
            headers: r#"["not", "an", "object"]"#,
            ..Poison::new("headers_array")
        },
        Poison {
            headers: r#"{"x-count": 1}"#,
            ..Poison::new("header_value_number")
        },
        Poison {
            headers: "{\"x-evil\\r\\nInjected\": \"v\"}",
            ..Poison::new("header_name_crlf")
        },
        Poison {
            destination: String::new(),
            ..Poison::new("destination_empty")
        },
        Poison {
            destination: "chaos\npoison".to_owned(),
            ..Poison::new("destination_newline")
        },
        Poison {
            content_type: Some("c".repeat(10 * 1024)),
            ..Poison::new("content_type_10kb")
        },
        Poison {
            key: Some("k".repeat(10 * 1024)),
            ..Poison::new("partition_key_10kb")
        },
    ]
}

/// Insert `poison` into `table` (qualified); returns its id.
pub(crate) async fn plant(pool: &PgPool, table: &str, poison: &Poison) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(&format!(
        "INSERT INTO {table} (id, destination, partition_key, payload, content_type, headers, \
         created_at, available_at, attempts) \
         VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7::text::timestamptz, \
         $8::text::timestamptz, $9)"
    ))
    .bind(id)
    .bind(&poison.destination)
    .bind(poison.key.as_deref().unwrap_or(SHARED_KEY))
    .bind(b"poison".as_slice())
    .bind(poison.content_type.as_deref())
    .bind(poison.headers)
    .bind(poison.created_at)
    .bind(poison.available_at)
    .bind(poison.attempts)
    .execute(pool)
    .await
    .unwrap_or_else(|e| panic!("plant poison {}: {e}", poison.name));
    id
}

/// One poison kind under one ordering, with its own table and worker.
#[derive(Debug)]
pub(crate) struct Trial {
    pub(crate) poison: Poison,
    pub(crate) order: KeyOrder,
    pub(crate) schema: String,
    /// Qualified table name.
    pub(crate) table: String,
    pub(crate) worker: Worker,
    pub(crate) poison_id: Uuid,
    pub(crate) normals: Vec<Sent>,
}

/// The poison row as the trial left it.
#[derive(Debug)]
struct PoisonRow {
    dead: bool,
    in_flight: bool,
    last_error: Option<String>,
    attempts: i32,
    available_at: String,
}

impl Trial {
    /// Normal messages published at least once.
    async fn normals_delivered(&self, pool: &PgPool) -> usize {
        let ids: Vec<Uuid> = self.normals.iter().map(|s| s.id).collect();
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(DISTINCT message_id) FROM \"{}\".published WHERE message_id = ANY($1)",
            self.schema
        ))
        .bind(&ids)
        .fetch_one(pool)
        .await
        .expect("count delivered normal messages");
        usize::try_from(n).expect("a count")
    }

    async fn poison_published(&self, pool: &PgPool) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\".published WHERE message_id = $1",
            self.schema
        ))
        .bind(self.poison_id)
        .fetch_one(pool)
        .await
        .expect("count poison publishes")
    }

    /// `None` when the row is gone (completed, which deletes it).
    async fn poison_row(&self, pool: &PgPool) -> Option<PoisonRow> {
        let row: Option<(bool, bool, Option<String>, i32, String)> = sqlx::query_as(&format!(
            "SELECT dead_at IS NOT NULL, lease_token IS NOT NULL AND available_at > now(), \
             last_error, attempts, available_at::text FROM {} WHERE id = $1",
            self.table
        ))
        .bind(self.poison_id)
        .fetch_optional(pool)
        .await
        .expect("read the poison row");
        row.map(
            |(dead, in_flight, last_error, attempts, available_at)| PoisonRow {
                dead,
                in_flight,
                last_error,
                attempts,
                available_at,
            },
        )
    }

    /// Whether there is nothing left to wait for: the worker is gone, or every normal
    /// message is delivered and the poison row dead.
    pub(crate) async fn settled(&mut self, pool: &PgPool) -> bool {
        if self.worker.exited().is_some() {
            return true;
        }
        self.normals_delivered(pool).await == self.normals.len()
            && self.poison_row(pool).await.is_some_and(|r| r.dead)
    }

    /// `Ok` with what happened when the trial passed, `Err` with every way it failed.
    pub(crate) async fn verdict(&mut self, pool: &PgPool) -> Result<String, String> {
        let mut failures = Vec::new();
        if let Some(status) = self.worker.exited() {
            let why = self
                .worker
                .panic_message()
                .unwrap_or_else(|| self.worker.log_tail(3));
            failures.push(format!("worker exited ({status}): {}", short(&why)));
        }
        let delivered = self.normals_delivered(pool).await;
        if delivered < self.normals.len() {
            failures.push(format!(
                "{delivered}/{} normal messages delivered",
                self.normals.len()
            ));
        }
        let published = self.poison_published(pool).await;
        let mut passed = String::new();
        match self.poison_row(pool).await {
            None => failures.push(format!(
                "poison published {published}x and completed instead of dead-lettered"
            )),
            Some(row) if !row.dead => {
                let state = if row.in_flight {
                    "in flight"
                } else {
                    "pending"
                };
                failures.push(format!(
                    "poison not dead-lettered: {state}, attempts {}, available_at {}, \
                     published {published}x, last_error {}",
                    row.attempts,
                    row.available_at,
                    row.last_error.as_deref().map_or("none".to_owned(), short)
                ));
            }
            Some(row) => {
                let error = row.last_error.unwrap_or_default();
                if let Err(why) = readable(&error) {
                    failures.push(format!("dead letter's last_error {why}: {}", short(&error)));
                }
                if published > 0 {
                    failures.push(format!(
                        "poison published {published}x before being dead-lettered"
                    ));
                }
                passed = format!("dead-lettered: {}", short(&error));
            }
        }
        if failures.is_empty() {
            return Ok(passed);
        }
        // What the relay logged last usually says why (for example a failing claim).
        if let Some(warning) = self.worker.log_lines_with("WARN").pop() {
            failures.push(format!("last worker warning: {}", short(&warning)));
        }
        Err(failures.join("; "))
    }
}

/// Non-empty, within the store's limit, one line of printable text.
fn readable(error: &str) -> Result<(), &'static str> {
    if error.trim().is_empty() {
        Err("is empty")
    } else if error.len() > MAX_ERROR_LEN {
        Err("is longer than 8 KiB")
    } else if error.chars().any(char::is_control) {
        Err("contains control characters")
    } else {
        Ok(())
    }
}

/// At most 200 characters, control characters escaped.
fn short(text: &str) -> String {
    let escaped: String = text.escape_debug().collect();
    if escaped.chars().count() > 200 {
        let cut: String = escaped.chars().take(200).collect();
        format!("{cut}...")
    } else {
        escaped
    }
}
