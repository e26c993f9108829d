//! Retention: deleting `success` keys once they are older than a window.
//!
//! Without retention the status table keeps one row per business fact forever (about
//! 160 MB per million keys). A `success` key only matters while a duplicate of its message
//! can still arrive: while the message is in the topic, in a retry queue or in a replay an
//! operator may start. After that window the row can go.
//!
//! **The trade-off**: a duplicate that arrives after its key was deleted is a new message
//! to idem. Its body runs again and its effects are applied a second time. Choose a window
//! longer than the longest time a message can be delivered again (the topic's retention,
//! the longest replay you would run, the dead-letter queue's age), plus the Redis cache's
//! TTL, which only answers from entries written before the deletion. The default, 7 days,
//! covers Kafka's default topic retention.
//!
//! What retention deletes and keeps:
//!
//! - only keys whose status is `success` and whose last change (`updated_at`, on the
//!   database's clock) is older than the window of their scope;
//! - `failed` and `parked` keys are never deleted by retention: they wait for the next
//!   delivery or for an operator (`idem keys retry`, `idem keys release`, or
//!   [`Idem::reset`](crate::Idem::reset)); `processing` leases are kept too. Keys kept by
//!   the fact's time are the exception: an expired bucket is dropped with all its keys,
//!   whatever their status (see [`time_buckets`](crate::time_buckets));
//! - a scope may have a window of its own, longer or shorter than the default: declared by
//!   its handler (`#[idempotent(retention = "90d")]`), which
//!   records it with the scope in the database when the handler first runs, so that every
//!   cleaner and `idem purge` apply it; or set by whoever runs the cleanup
//!   ([`Retention::scope_window`], `idem purge --scope-window`), which comes first.
//!
//! # How the cleanup runs
//!
//! [`Idem::purge`](crate::Idem::purge) (or `idem purge` on the command line, or the
//! background task of [`Idem::spawn_retention`](crate::Idem::spawn_retention)):
//!
//! 1. takes a session-level advisory lock derived from the status table's schema
//!    (`pg_try_advisory_lock`): one cleaner per status table at a time; a second one
//!    returns at once with [`PurgeReport::locked_out`] set. Status tables in other schemas
//!    have their own lock. Behind a transaction pooler
//!    ([`Pooler::Transaction`]), where no session outlives a
//!    transaction, each batch takes the same lock for its own transaction
//!    (`pg_try_advisory_xact_lock`), and a cleaner that finds it taken stops;
//! 2. deletes in batches of at most [`Retention::batch_size`] rows, each batch in its own
//!    short transaction with `SET LOCAL statement_timeout`. The rows are picked with
//!    `FOR UPDATE SKIP LOCKED` and deleted by their row addresses in the same statement
//!    (a TID scan: no join against the table), so a cleaner never waits for a row that a
//!    handler's transaction holds; a claim of a key whose deletion is in flight waits at
//!    most for that one batch, then claims the key afresh;
//! 3. halves the batch after a batch hits the statement timeout, and stops after a batch
//!    of one timed out ([`PurgeReport::finished`] is then `false`);
//! 4. stops when a batch deletes fewer rows than it asked for, or after
//!    [`Retention::max_batches`].
//!
//! The scan uses the BRIN index on `created_at` (migration 0003): a key's last change is
//! never before its creation, so `created_at` older than the window is implied and given
//! to the planner. No index on `status` or `updated_at` is needed; one would cost every
//! status change its HOT update.
//!
//! The cleanup holds one connection of the handle's pool while it runs, and closes it
//! afterwards (the advisory lock belongs to the session; behind a transaction pooler the
//! connection goes back to the pool). Its role needs `DELETE` on the
//! status table, which [`consumer_grants`](crate::privileges::consumer_grants) does not
//! give: run it under the role that owns the schema (`idem purge`), or grant it
//! (`GRANT DELETE ON idem.idem_keys TO ...`) to the consumers that start the background
//! task; for handlers with `event_time`, also `EXECUTE` on `idem_timed_expire` (without
//! it, expired buckets are not dropped and each run logs a warning).
//!
//! **What it costs the claim path**, measured on a 2-core machine shared with PostgreSQL
//! (the ignored test `cleanup_cost_on_the_claim_path` of the repository's
//! `idem-runtime/tests/retention.rs`): four workers delivering new messages ran at 0.73x-0.89x their
//! rate while a cleaner deleted a backlog at full speed (120,000-156,000 keys a second), and at
//! their full rate (within noise) while it deleted 4,800 keys a second with a pause of 1 s
//! between batches. A cleaner that keeps up with steady traffic only deletes what arrives
//! (at 500 keys a second, a batch of 5,000 every 10 s); a large backlog is better cleared
//! with a [`pause`](Retention::pause).
//!
//! Keys of handlers with `event_time` are not deleted row by row: each run also makes
//! the time buckets ahead and drops the expired ones whole (see
//! [`time_buckets`](crate::time_buckets)).
//!
//! Each batch adds its deletions to the counter `idem_retention_deleted_total` (label
//! `scope`), see [`telemetry`](crate::telemetry).
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_runtime::{Idem, retention::Retention};
//!
//! # async fn start(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idem::builder(pool)
//!     .retention(
//!         Retention::new(Duration::from_secs(14 * 24 * 3600))
//!             .scope_window("billing::apply_payment", Duration::from_secs(90 * 24 * 3600)),
//!     )
//!     .build()?;
//! // Off by default: one call runs the cleanup every `Retention::interval` until stopped.
//! let cleaner = idem.spawn_retention();
//! // ... consume ...
//! cleaner.stop().await;
//! // Or once, from code:
//! let report = idem.purge().await?;
//! println!("deleted {} keys in {} batches", report.deleted, report.batches);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use sqlx::PgConnection;

use crate::Idem;
use crate::config::Pooler;
pub use crate::config::retention::{DEFAULT_WINDOW, LONGEST, Retention};
use crate::store::{BucketRange, TimeBucket, Windows};

/// What one cleanup did (or, from [`Idem::purge_dry_run`], would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Keys deleted (or, in a dry run, that would be deleted now).
    pub deleted: u64,
    /// The same, per scope.
    pub by_scope: BTreeMap<String, u64>,
    /// Batches that committed.
    pub batches: u32,
    /// Batches that hit the statement timeout and rolled back.
    pub timeouts: u32,
    /// Another cleaner of the same status table held the lock: this one deleted nothing.
    pub locked_out: bool,
    /// Nothing expired is left (as far as this run saw). `false` when the run stopped at
    /// [`Retention::max_batches`] or after a batch of one row timed out.
    pub finished: bool,
    /// A dry run: nothing was deleted.
    pub dry_run: bool,
    /// Time buckets made ahead for the keys of handlers with `event_time` (see
    /// [`time_buckets`](crate::time_buckets)).
    pub buckets_made: u64,
    /// Expired time buckets dropped, each with all its keys.
    pub buckets_dropped: u64,
    /// How long the cleanup took, in milliseconds.
    pub elapsed_ms: u64,
}

/// `query_canceled`: the statement timeout fired.
fn timed_out(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("57014"))
}

pub(crate) async fn purge(idem: &Idem, retention: &Retention) -> Result<PurgeReport, sqlx::Error> {
    let started = Instant::now();
    let mut report = PurgeReport::default();
    // The time buckets first: constant time, and no lock of the status table's cleanup.
    // A role without `EXECUTE` on their functions (granted by an earlier release's
    // `consumer_grants`) still deletes the status table's keys.
    match crate::time_buckets::upkeep(idem, retention).await {
        Ok(upkeep) => {
            report.buckets_made = upkeep.made;
            report.buckets_dropped = upkeep.dropped;
        }
        Err(error) => {
            tracing::warn!(%error, "idem retention: the time buckets could not be kept");
        }
    }
    let statements = idem.statements();
    let mut conn = idem.pool().acquire().await?;
    if idem.config().pooler() == Pooler::Transaction {
        // No session outlives a transaction behind a transaction pooler: each batch takes
        // the lock for its own transaction, and a cleaner that finds it taken stops.
        run_batches(idem, retention, &mut conn, true, &mut report).await?;
        report.elapsed_ms = elapsed_ms(started);
        return Ok(report);
    }
    if !statements.try_lock_cleanup(&mut conn).await? {
        report.locked_out = true;
        report.elapsed_ms = elapsed_ms(started);
        return Ok(report);
    }
    // The lock belongs to the session: however this run ends (an error, a dropped
    // future), the connection is closed rather than returned to the pool with it.
    conn.close_on_drop();
    let result = run_batches(idem, retention, &mut conn, false, &mut report).await;
    if result.is_ok() {
        statements.unlock_cleanup(&mut conn).await?;
    }
    result?;
    report.elapsed_ms = elapsed_ms(started);
    Ok(report)
}

async fn run_batches(
    idem: &Idem,
    retention: &Retention,
    conn: &mut PgConnection,
    lock_each_batch: bool,
    report: &mut PurgeReport,
) -> Result<(), sqlx::Error> {
    let statements = idem.statements();
    let windows = Windows::of(retention);
    let mut batch_size = retention.batch_size;
    loop {
        if retention
            .max_batches
            .is_some_and(|max| report.batches >= max)
        {
            return Ok(());
        }
        let mut tx = statements
            .begin_cleanup_batch(conn, retention.statement_timeout)
            .await?;
        if lock_each_batch && !statements.try_lock_cleanup_batch(&mut tx).await? {
            tx.rollback().await?;
            report.locked_out = report.batches == 0;
            return Ok(());
        }
        let rows = statements
            .delete_expired(&mut tx, &windows, batch_size)
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(error) if timed_out(&error) => {
                tx.rollback().await?;
                report.timeouts += 1;
                tracing::warn!(
                    batch_size,
                    "idem retention: a batch hit the statement timeout"
                );
                if batch_size == 1 {
                    return Ok(());
                }
                batch_size /= 2;
                continue;
            }
            Err(error) => return Err(error),
        };
        tx.commit().await?;
        report.batches += 1;
        let mut deleted = 0;
        for (scope, count) in rows {
            let count = u64::try_from(count).unwrap_or(0);
            crate::telemetry::retention_deleted(&scope, count);
            *report.by_scope.entry(scope).or_default() += count;
            deleted += count;
        }
        report.deleted += deleted;
        if deleted < u64::from(batch_size) {
            report.finished = true;
            return Ok(());
        }
        if !retention.pause.is_zero() {
            tokio::time::sleep(retention.pause).await;
        }
    }
}

pub(crate) async fn dry_run(
    idem: &Idem,
    retention: &Retention,
) -> Result<PurgeReport, sqlx::Error> {
    Ok(plan(idem, retention).await?.0)
}

/// What a cleanup with `retention` would do now: the report of a dry run (the keys it
/// would delete, and how many buckets it would make and drop), with the buckets it would
/// make ahead and those it would drop.
pub(crate) async fn plan(
    idem: &Idem,
    retention: &Retention,
) -> Result<(PurgeReport, Vec<BucketRange>, Vec<TimeBucket>), sqlx::Error> {
    let started = Instant::now();
    let windows = Windows::of(retention);
    let statements = idem.statements();
    let rows = statements.count_expired(idem.pool(), &windows).await?;
    let (to_make, to_drop) = statements
        .bucket_plan(
            idem.pool(),
            retention.bucket_width_duration(),
            retention.future_bound_duration(),
            retention.longest_window(),
        )
        .await?;
    let mut report = PurgeReport {
        dry_run: true,
        finished: true,
        buckets_made: to_make.len() as u64,
        buckets_dropped: to_drop.len() as u64,
        ..PurgeReport::default()
    };
    for (scope, count) in rows {
        let count = u64::try_from(count).unwrap_or(0);
        report.deleted += count;
        report.by_scope.insert(scope, count);
    }
    report.elapsed_ms = elapsed_ms(started);
    Ok((report, to_make, to_drop))
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The background cleanup started by [`Idem::spawn_retention`].
///
/// It runs [`Idem::purge`] at once and then every [`Retention::interval`]; errors are
/// logged (`tracing`, target `idem_runtime::retention`) and the next run tries again.
/// [`stop`](Self::stop) ends it after the batch in flight rolls back; dropping the handle
/// aborts it the same way.
#[derive(Debug)]
pub struct RetentionTask {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RetentionTask {
    pub(crate) fn spawn(idem: Idem) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let interval = idem.config().retention().interval;
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    result = purge(&idem, idem.config().retention()) => match result {
                        Ok(report) if report.deleted > 0 || report.timeouts > 0 || report.buckets_dropped > 0 => tracing::info!(
                            deleted = report.deleted,
                            batches = report.batches,
                            timeouts = report.timeouts,
                            buckets_dropped = report.buckets_dropped,
                            "idem retention: cleanup ran"
                        ),
                        Ok(_) => {}
                        Err(error) => tracing::warn!(%error, "idem retention: cleanup failed"),
                    },
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
        RetentionTask {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the task and waits until it has ended.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Whether the task has ended (only after [`stop`](Self::stop), or a panic).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|task| task.is_finished())
    }
}

impl Drop for RetentionTask {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
