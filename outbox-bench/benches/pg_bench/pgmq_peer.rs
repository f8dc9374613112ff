//! The peer a user would pick instead: pgmq's pure-Rust client, [`pgmq::PGMQueue`].
//!
//! `PGMQueue` is deprecated in favour of `PGMQueueExt`, which needs the pgmq extension
//! installed in the server; the pure-Rust client needs nothing but a pool, so it is the
//! fair peer for a library that also needs nothing but a pool.
#![allow(deprecated)]

use std::time::{Duration, Instant};

use pgmq::PGMQueue;
use sqlx::PgPool;

use crate::harness::{order_json, vacuum, Env, Res};

/// pgmq's schema is fixed by the crate.
const PGMQ_SCHEMA: &str = "pgmq";
/// The bench's queue (tables `pgmq.q_<name>` and `pgmq.a_<name>`).
pub(crate) const QUEUE: &str = "obx_bench_drain";
/// Visibility timeout of a read, in seconds (the relays' lease is 30 s too).
const VT_SECONDS: i32 = 30;

/// A pgmq queue the bench created, and whether pgmq's schema is the bench's to drop.
#[derive(Debug)]
pub(crate) struct Peer {
    admin: PgPool,
    created_schema: bool,
}

impl Peer {
    /// Create the bench's queue (and pgmq's schema when missing).
    pub(crate) async fn setup(env: &Env) -> Res<Peer> {
        let admin = env.pool(2).await?;
        // The bench owns pgmq's schema unless it holds queues other than the bench's
        // (a crashed run may have left the schema with only the bench's queue).
        let meta: Option<String> = sqlx::query_scalar("SELECT to_regclass('pgmq.meta')::text")
            .fetch_one(&admin)
            .await?;
        let others: i64 = match meta {
            None => 0,
            Some(_) => {
                sqlx::query_scalar("SELECT count(*) FROM pgmq.meta WHERE queue_name <> $1")
                    .bind(QUEUE)
                    .fetch_one(&admin)
                    .await?
            }
        };
        PGMQueue::new_with_pool(admin.clone())
            .await
            .create(QUEUE)
            .await?;
        Ok(Peer {
            admin,
            created_schema: others == 0,
        })
    }

    /// The queue's table, `pgmq.q_<name>`.
    pub(crate) fn table() -> String {
        format!("{PGMQ_SCHEMA}.q_{QUEUE}")
    }

    /// Empty the queue, send `n` messages with `send_batch` (1,000 per call), vacuum.
    pub(crate) async fn reset(&self, n: u64) -> Res<()> {
        sqlx::query(&format!("TRUNCATE {}", Self::table()))
            .execute(&self.admin)
            .await?;
        let queue = PGMQueue::new_with_pool(self.admin.clone()).await;
        let mut next = 0;
        while next < n {
            let end = (next + 1_000).min(n);
            let batch: Vec<serde_json::Value> = (next..end).map(order_json).collect();
            queue.send_batch(QUEUE, &batch).await?;
            next = end;
        }
        vacuum(&self.admin, &Self::table()).await
    }

    /// Pre-load `n` messages, then `workers` tasks loop `read_batch` + `delete_batch`
    /// of `batch` until a read comes back empty; returns the time to drain.
    pub(crate) async fn drain(
        &self,
        env: &Env,
        batch: usize,
        workers: u32,
        n: u64,
    ) -> Res<(Duration, crate::cpu::Spent)> {
        self.reset(n).await?;
        let pool = env.pool(workers).await?;
        let queue = PGMQueue::new_with_pool(pool.clone()).await;
        let batch = i32::try_from(batch)?;
        let cpu = crate::cpu::sample(outbox_testkit::cpu::Server::Postgres);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..workers {
            let queue = queue.clone();
            tasks.push(tokio::spawn(async move {
                let mut done = 0_u64;
                while let Some(messages) = queue
                    .read_batch::<serde_json::Value>(QUEUE, Some(VT_SECONDS), batch)
                    .await?
                {
                    let ids: Vec<i64> = messages.iter().map(|m| m.msg_id).collect();
                    done += queue.delete_batch(QUEUE, &ids).await?;
                }
                Res::Ok(done)
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await??;
        }
        let took = start.elapsed();
        let spent = crate::cpu::since(cpu);
        pool.close().await;
        let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", Self::table()))
            .fetch_one(&self.admin)
            .await?;
        if total != n || left != 0 {
            return Err(format!("pgmq drained {total} of {n}, {left} left in the queue").into());
        }
        Ok((took, spent))
    }

    /// Destroy the queue, and pgmq's schema if the bench created it.
    pub(crate) async fn teardown(self) -> Res<()> {
        PGMQueue::new_with_pool(self.admin.clone())
            .await
            .destroy(QUEUE)
            .await?;
        if self.created_schema {
            sqlx::query(&format!("DROP SCHEMA {PGMQ_SCHEMA} CASCADE"))
                .execute(&self.admin)
                .await?;
        }
        self.admin.close().await;
        Ok(())
    }
}
