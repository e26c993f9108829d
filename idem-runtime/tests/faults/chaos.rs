//! The fault injectors, each a task of its own that runs while the workload does and
//! counts what it injected:
//!
//! - backends killed at random, and backends killed while their `COMMIT` is in flight
//!   (the commit statement seen running in `pg_stat_activity`);
//! - PostgreSQL restarted hard (`pg_ctl restart -m immediate`), spread over the run;
//! - Redis flushed, shut down and killed, then started again (empty);
//! - the retention cleanup, with a window of 1 ms on the receipts' scope, racing their
//!   duplicates;
//! - and, delivering payments of their own: pairs of bodies that lock two accounts in
//!   opposite order (deadlocks), bodies that hold their key past the lock timeout while
//!   duplicates arrive, and lease-mode bodies that outlive their lease while a duplicate
//!   takes the key over.
//!
//! Handler errors, aborted tasks and dropped futures are injected by the bodies and the
//! workers themselves; serialization failures come from the worker whose transactions
//! are `SERIALIZABLE`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_runtime::Idem;
use idem_runtime::retention::Retention;
use sqlx::PgPool;
use tokio::task::JoinHandle;

use crate::fault_counts::FaultCounts;
use crate::ledger::{LEASE, RECEIPT_SCOPE};
use crate::seeded_random::SeededRandom;
use crate::settlement::Settlement;
use crate::throwaway_postgres::ThrowawayPostgres;
use crate::throwaway_redis::ThrowawayRedis;
use crate::workers::{Attempt, Run, Why, conclude, deliver};

/// The application names of the workload's connections, the ones the chaos kills.
pub const WORKLOAD_CONNECTIONS: &[&str] =
    &["ledger-worker", "ledger-serializable", "external-service"];

/// The first statement of the runtime's commit query (`Statements::commit`).
const COMMIT_STATEMENT: &str = "SAVEPOINT idem_commit_check";

/// The running injectors of infrastructure faults.
#[derive(Default)]
pub struct Chaos {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Chaos {
    /// Whether the chaos is over.
    fn stopping(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Ends every injector and waits for it (a restart or a Redis start in progress
    /// finishes first).
    pub async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("an injector panicked");
        }
    }

    /// Kills a random busy backend of the workload every 40-160 ms.
    pub fn kill_backends(
        &mut self,
        chaos: PgPool,
        counts: Arc<FaultCounts>,
        mut random: SeededRandom,
    ) {
        let stop = self.stopping();
        self.tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(random.between(40, 160))).await;
                let killed: Result<Option<bool>, _> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE backend_type = 'client backend' AND application_name = ANY($1)
                       AND state IN ('active', 'idle in transaction')
                     ORDER BY random() LIMIT 1",
                )
                .bind(WORKLOAD_CONNECTIONS)
                .fetch_optional(&chaos)
                .await;
                if let Ok(Some(true)) = killed {
                    FaultCounts::bump(&counts.backends_killed);
                }
            }
        }));
    }

    /// Watches `pg_stat_activity` for backends running the commit statement and kills
    /// them, then pauses a little so that most commits still get through.
    pub fn kill_commits(
        &mut self,
        chaos: PgPool,
        counts: Arc<FaultCounts>,
        mut random: SeededRandom,
    ) {
        let stop = self.stopping();
        self.tasks.push(tokio::spawn(async move {
            let pattern = format!("{COMMIT_STATEMENT}%");
            while !stop.load(Ordering::SeqCst) {
                let killed: Result<i64, _> = sqlx::query_scalar(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                     FROM pg_stat_activity
                     WHERE state = 'active' AND application_name = ANY($1) AND query LIKE $2",
                )
                .bind(WORKLOAD_CONNECTIONS)
                .bind(&pattern)
                .fetch_one(&chaos)
                .await;
                match killed {
                    Ok(killed) if killed > 0 => {
                        counts
                            .commits_killed
                            .fetch_add(killed as u64, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(random.between(50, 250))).await;
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }));
    }

    /// Restarts PostgreSQL hard `restarts` times, spread evenly over the queue.
    pub fn restart_postgres(
        &mut self,
        cluster: Arc<ThrowawayPostgres>,
        settlement: Arc<Settlement>,
        restarts: u32,
        counts: Arc<FaultCounts>,
    ) {
        let stop = self.stopping();
        self.tasks.push(tokio::spawn(async move {
            for n in 1..=restarts {
                let due = f64::from(n) / f64::from(restarts + 1);
                while settlement.progress() < due && !stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let cluster = Arc::clone(&cluster);
                tokio::task::spawn_blocking(move || cluster.restart_immediately())
                    .await
                    .expect("the restart panicked");
                FaultCounts::bump(&counts.postgres_restarts);
            }
        }));
    }

    /// Every 250-800 ms, in turn: flushes Redis, shuts it down, kills it; a stopped Redis
    /// starts again after 100-400 ms. Leaves it running when stopped.
    pub fn upset_redis(
        &mut self,
        redis: Arc<tokio::sync::Mutex<ThrowawayRedis>>,
        counts: Arc<FaultCounts>,
        mut random: SeededRandom,
    ) {
        let stop = self.stopping();
        self.tasks.push(tokio::spawn(async move {
            for round in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(random.between(250, 800))).await;
                let mut server = redis.lock().await;
                match round % 3 {
                    0 => {
                        if server.flush().await {
                            FaultCounts::bump(&counts.redis_flushes);
                        }
                    }
                    down => {
                        if down == 1 {
                            server.shut_down().await;
                            FaultCounts::bump(&counts.redis_shutdowns);
                        } else {
                            server.kill();
                            FaultCounts::bump(&counts.redis_kills);
                        }
                        tokio::time::sleep(Duration::from_millis(random.between(100, 400))).await;
                        server.start_again().await;
                    }
                }
            }
        }));
    }

    /// Runs the retention cleanup every 20-100 ms with a window of 1 ms on the receipts'
    /// scope (7 days elsewhere), on connections of its own.
    pub fn race_retention(
        &mut self,
        cleaner: Idem,
        counts: Arc<FaultCounts>,
        mut random: SeededRandom,
    ) {
        let stop = self.stopping();
        self.tasks.push(tokio::spawn(async move {
            let retention = Retention::new(Duration::from_secs(7 * 24 * 3600))
                .scope_window(RECEIPT_SCOPE, Duration::from_millis(1));
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(random.between(20, 100))).await;
                if let Ok(report) = cleaner.purge_with(&retention).await
                    && !report.locked_out
                {
                    FaultCounts::bump(&counts.purges);
                    counts
                        .keys_purged
                        .fetch_add(report.deleted, Ordering::Relaxed);
                }
            }
        }));
    }
}

/// Delivers the lock-order pairs, both payments of a pair at once: each locks its account
/// and then the other's, so that PostgreSQL finds a deadlock and aborts one of them.
pub fn lock_order_pairs(run: Arc<Run>, mut random: SeededRandom) -> JoinHandle<()> {
    tokio::spawn(async move {
        for &(a, b) in &run.plan.lock_order_pairs {
            tokio::time::sleep(Duration::from_millis(random.between(100, 600))).await;
            let (first, second) =
                tokio::join!(deliver(&run, &run.idem, a), deliver(&run, &run.idem, b));
            FaultCounts::bump(&run.counts.lock_order_pairs);
            conclude(&run, &mut random, a, first);
            conclude(&run, &mut random, b, second);
        }
    })
}

/// Delivers each slow payment three times at once (twice on the shared handle, which
/// waits in the process, once on the other, which waits in PostgreSQL): the body holds
/// the key past the lock timeout, and the duplicates give up with `InProgress`.
pub fn slow_bodies(run: Arc<Run>, mut random: SeededRandom) -> JoinHandle<()> {
    tokio::spawn(async move {
        for &id in &run.plan.slow_bodies {
            tokio::time::sleep(Duration::from_millis(random.between(100, 600))).await;
            let (first, second, third) = tokio::join!(
                deliver(&run, &run.idem, id),
                async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    deliver(&run, &run.idem, id).await
                },
                async {
                    tokio::time::sleep(Duration::from_millis(80)).await;
                    deliver(&run, &run.serializable, id).await
                },
            );
            for attempt in [first, second, third] {
                if matches!(attempt, Attempt::Retry(Why::InProgress)) {
                    FaultCounts::bump(&run.counts.lock_timeouts);
                }
                conclude(&run, &mut random, id, attempt);
            }
        }
    })
}

/// Delivers each lease-outliving payment, and again once its lease ran out while the
/// first body still sleeps: the second claims the key and completes, the first's
/// completion is refused (`LeaseLost`), and the external service absorbs the repeated
/// call on the lease key.
pub fn outlived_leases(run: Arc<Run>, mut random: SeededRandom) -> JoinHandle<()> {
    tokio::spawn(async move {
        for &id in &run.plan.outlived_leases {
            tokio::time::sleep(Duration::from_millis(random.between(100, 600))).await;
            let (first, second) = tokio::join!(deliver(&run, &run.idem, id), async {
                tokio::time::sleep(LEASE + Duration::from_millis(250)).await;
                deliver(&run, &run.idem, id).await
            });
            for attempt in [first, second] {
                if matches!(attempt, Attempt::Retry(Why::LeaseLost)) {
                    FaultCounts::bump(&run.counts.leases_lost);
                }
                conclude(&run, &mut random, id, attempt);
            }
        }
    })
}
