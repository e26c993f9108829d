//! Retention: the cleanup deletes `success` keys older than their window, in batches,
//! while deliveries go on; it keeps recent, failed and parked keys; a duplicate inside the
//! window is still skipped; one cleaner runs at a time per status table.
mod support;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_runtime::Status;
use idem_runtime::key::KeyBuilder;
use idem_runtime::retention::Retention;
use idem_runtime::{Error, Idem, IdempotencyKey, idempotent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sqlx::{PgConnection, PgPool};
use support::orders::OrderEvent;
use support::testing;

const DAY: Duration = Duration::from_secs(24 * 3600);

#[idempotent(key = "order_id", scope = "retention::apply")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id", scope = "retention::storm")]
async fn storm(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id", scope = "retention::audit")]
async fn audit(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

/// Keeps its keys 30 days, whatever the cleaner's default.
#[idempotent(key = "order_id", scope = "retention::declared", retention = "30d")]
async fn declared(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[derive(Debug, thiserror::Error)]
#[error("declined")]
struct Declined;

/// Fails for negative amounts; parks after two failures.
#[idempotent(key = "order_id", scope = "retention::decline", max_attempts = 2)]
async fn decline(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, Declined> {
    if event.amount_cents < 0 {
        return Err(Declined);
    }
    testing::insert_effect(tx, event)
        .await
        .map_err(|_| Declined)
}

fn key_of(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

/// Moves the keys of `order_ids` in `scope` `age` into the past (created and last changed).
async fn age_keys(pool: &PgPool, scope: &str, order_ids: &[String], age: Duration) {
    let keys: Vec<uuid::Uuid> = order_ids.iter().map(|id| key_of(id).as_uuid()).collect();
    let aged = sqlx::query(
        "UPDATE idem.idem_keys \
         SET created_at = now() - $3 * interval '1 second', updated_at = now() - $3 * interval '1 second' \
         WHERE scope = $1 AND key = ANY($2)",
    )
    .bind(scope)
    .bind(&keys)
    .bind(age.as_secs_f64())
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(aged.rows_affected(), keys.len() as u64);
}

async fn status(idem: &Idem, scope: &str, order_id: &str) -> Option<Status> {
    idem.record(scope, key_of(order_id))
        .await
        .unwrap()
        .map(|record| record.status)
}

async fn keys_of(pool: &PgPool, scope: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem.idem_keys WHERE scope = $1")
        .bind(scope)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The recorder of this test binary (installed once).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

fn deleted_metric(scope: &str) -> u64 {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "idem_retention_deleted_total")
        .filter(|(key, ..)| {
            key.key()
                .labels()
                .any(|label| label.key() == "scope" && label.value() == scope)
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("not a counter: {other:?}"),
        })
        .sum()
}

#[sqlx::test(migrations = false)]
async fn old_successes_are_deleted_in_batches_while_a_storm_of_deliveries_runs(pool: PgPool) {
    let scope = "retention::storm";
    snapshotter();
    let idem = testing::setup(&pool).await;

    // 600 successes 8 days old, 50 of 6 days (inside the window), 50 recent ones.
    let old = ids("old", 600);
    let inside = ids("inside", 50);
    let recent = ids("recent", 50);
    for id in old.iter().chain(&inside).chain(&recent) {
        assert!(
            storm(&idem, &testing::paid(id, 1))
                .await
                .unwrap()
                .is_executed()
        );
    }
    age_keys(&pool, scope, &old, 8 * DAY).await;
    age_keys(&pool, scope, &inside, 6 * DAY).await;

    // A failed key and a parked key, both 30 days old.
    let failing = testing::paid("declined-failed", -1);
    let parking = testing::paid("declined-parked", -1);
    assert!(matches!(
        decline(&idem, &failing).await,
        Err(Error::Handler { parked: false, .. })
    ));
    for _ in 0..2 {
        let _ = decline(&idem, &parking).await;
    }
    assert_eq!(
        status(&idem, "retention::decline", "declined-parked").await,
        Some(Status::Parked)
    );
    let declined = ["declined-failed".to_owned(), "declined-parked".to_owned()];
    age_keys(&pool, "retention::decline", &declined, 30 * DAY).await;
    let effects_before = testing::count_rows(&pool, "order_effects").await;
    assert_eq!(effects_before, 700);

    // The storm: new messages and duplicates of the keys inside the window, from four
    // workers, for as long as the cleanup runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let new_executed = std::sync::Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (idem, stop, new_executed) = (idem.clone(), stop.clone(), new_executed.clone());
        let (inside, recent) = (inside.clone(), recent.clone());
        workers.push(tokio::spawn(async move {
            let mut round = 0usize;
            let mut deliveries = 0u64;
            while !stop.load(Ordering::Relaxed) || round < 20 {
                let fresh = testing::paid(&format!("new-{worker}-{round}"), 1);
                assert!(storm(&idem, &fresh).await.unwrap().is_executed());
                new_executed.fetch_add(1, Ordering::Relaxed);
                // The same message again, and duplicates of keys inside the window.
                assert!(storm(&idem, &fresh).await.unwrap().is_duplicate());
                let again = &inside[(round * 4 + worker) % inside.len()];
                assert!(
                    storm(&idem, &testing::paid(again, 1))
                        .await
                        .unwrap()
                        .is_duplicate()
                );
                let again = &recent[(round * 4 + worker) % recent.len()];
                assert!(
                    storm(&idem, &testing::paid(again, 1))
                        .await
                        .unwrap()
                        .is_duplicate()
                );
                round += 1;
                deliveries += 4;
            }
            deliveries
        }));
    }

    let retention = Retention::new(7 * DAY)
        .batch_size(50)
        .pause(Duration::from_millis(5));
    let report = idem.purge_with(&retention).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut deliveries = 0;
    for worker in workers {
        deliveries += worker.await.unwrap();
    }
    assert!(deliveries >= 4 * 20 * 4, "{deliveries}");

    assert_eq!(report.deleted, 600, "{report:?}");
    assert_eq!(report.by_scope.get(scope), Some(&600));
    assert!(
        report.batches >= 12,
        "600 keys in batches of 50: {report:?}"
    );
    assert!(
        report.finished && !report.locked_out && report.timeouts == 0,
        "{report:?}"
    );
    assert_eq!(deleted_metric(scope), 600);

    // Every old success is gone; recent, inside-the-window, failed and parked keys stay.
    for id in &old {
        assert_eq!(status(&idem, scope, id).await, None, "{id}");
    }
    for id in inside.iter().chain(&recent) {
        assert_eq!(
            status(&idem, scope, id).await,
            Some(Status::Success),
            "{id}"
        );
    }
    assert_eq!(
        status(&idem, "retention::decline", "declined-failed").await,
        Some(Status::Failed)
    );
    assert_eq!(
        status(&idem, "retention::decline", "declined-parked").await,
        Some(Status::Parked)
    );
    let new = new_executed.load(Ordering::Relaxed);
    assert_eq!(keys_of(&pool, scope).await, 100 + new as i64);
    // Business rows are never touched; each new message applied once, duplicates none.
    assert_eq!(
        testing::count_rows(&pool, "order_effects").await,
        effects_before + new as i64
    );

    // After the cleanup: a duplicate inside the window is still skipped (the body does
    // not run), one after the window is a new message (the documented trade-off).
    assert!(
        storm(&idem, &testing::paid(&inside[0], 1))
            .await
            .unwrap()
            .is_duplicate()
    );
    assert!(
        storm(&idem, &testing::paid(&old[0], 1))
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(
        testing::count_rows(&pool, "order_effects").await,
        effects_before + new as i64 + 1
    );

    // Nothing is left to delete.
    let again = idem.purge_with(&retention).await.unwrap();
    assert_eq!((again.deleted, again.batches), (0, 1), "{again:?}");
}

#[sqlx::test(migrations = false)]
async fn a_scope_window_overrides_the_default(pool: PgPool) {
    let idem = testing::setup_with(
        Idem::builder(pool.clone())
            .retention(Retention::new(7 * DAY).scope_window("retention::audit", 30 * DAY))
            .build()
            .unwrap(),
    )
    .await;
    let ten_days = ids("ten-days", 3);
    for id in &ten_days {
        apply(&idem, &testing::paid(id, 1)).await.unwrap();
        audit(&idem, &testing::paid(id, 1)).await.unwrap();
    }
    age_keys(&pool, "retention::apply", &ten_days, 10 * DAY).await;
    age_keys(&pool, "retention::audit", &ten_days, 10 * DAY).await;

    let preview = idem.purge_dry_run(idem.config().retention()).await.unwrap();
    assert!(preview.dry_run);
    assert_eq!(preview.deleted, 3);
    assert_eq!(
        keys_of(&pool, "retention::apply").await,
        3,
        "a dry run deletes nothing"
    );

    let report = idem.purge().await.unwrap();
    assert_eq!(report.deleted, 3, "{report:?}");
    assert_eq!(keys_of(&pool, "retention::apply").await, 0);
    assert_eq!(keys_of(&pool, "retention::audit").await, 3);

    // A shorter window of its own: the scope's keys go earlier than the default's.
    let short = Retention::new(7 * DAY).scope_window("retention::audit", 5 * DAY);
    assert_eq!(idem.purge_with(&short).await.unwrap().deleted, 3);
    assert_eq!(keys_of(&pool, "retention::audit").await, 0);
}

#[sqlx::test(migrations = false)]
async fn a_window_declared_by_the_handler_is_recorded_and_applied_by_every_cleaner(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let keys = ids("declared", 4);
    for id in &keys {
        assert!(
            declared(&idem, &testing::paid(id, 1))
                .await
                .unwrap()
                .is_executed()
        );
    }
    let recorded: Option<i64> = sqlx::query_scalar(
        "SELECT retention_ms FROM idem.idem_scopes WHERE scope = 'retention::declared'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recorded, Some(30 * 24 * 3600 * 1000));
    age_keys(&pool, "retention::declared", &keys[..2], 31 * DAY).await;
    age_keys(&pool, "retention::declared", &keys[2..], 10 * DAY).await;

    // A cleaner in a handle where the handler never ran (another process, or the CLI)
    // still keeps the 10-day-old keys that its own default of 7 days would delete.
    let elsewhere = Idem::new(pool.clone());
    let report = elsewhere.purge().await.unwrap();
    assert_eq!(report.deleted, 2, "{report:?}");
    assert_eq!(keys_of(&pool, "retention::declared").await, 2);
    for id in &keys[2..] {
        assert!(
            declared(&idem, &testing::paid(id, 1))
                .await
                .unwrap()
                .is_duplicate()
        );
    }
    // The cleaner's own window for the scope comes first.
    let operator = Retention::new(7 * DAY).scope_window("retention::declared", 9 * DAY);
    assert_eq!(elsewhere.purge_with(&operator).await.unwrap().deleted, 2);

    // A handler whose window is removed records that too: the default applies again.
    apply(&idem, &testing::paid("before-change", 1))
        .await
        .unwrap();
    let changed = sqlx::query(
        "UPDATE idem.idem_scopes SET retention_ms = 1 WHERE scope = 'retention::apply'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(changed.rows_affected(), 1);
    let fresh = Idem::new(pool.clone());
    apply(&fresh, &testing::paid("after-change", 1))
        .await
        .unwrap();
    let recorded: Option<i64> = sqlx::query_scalar(
        "SELECT retention_ms FROM idem.idem_scopes WHERE scope = 'retention::apply'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recorded, None);
}

#[sqlx::test(migrations = false)]
async fn two_cleaners_at_once_do_not_both_run(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let old = ids("old", 60);
    for id in &old {
        apply(&idem, &testing::paid(id, 1)).await.unwrap();
    }
    age_keys(&pool, "retention::apply", &old, 8 * DAY).await;

    // A slow cleaner: batches of 5, 100 ms apart (about 1.2 s).
    let slow = Retention::new(7 * DAY)
        .batch_size(5)
        .pause(Duration::from_millis(100));
    let first = {
        let (idem, slow) = (idem.clone(), slow.clone());
        tokio::spawn(async move { idem.purge_with(&slow).await.unwrap() })
    };
    // Once it has deleted something, it holds the lock.
    let deadline = Instant::now() + Duration::from_secs(30);
    while keys_of(&pool, "retention::apply").await == 60 {
        assert!(Instant::now() < deadline, "the first cleaner never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = idem.purge_with(&Retention::new(7 * DAY)).await.unwrap();
    assert!(second.locked_out, "{second:?}");
    assert_eq!((second.deleted, second.batches), (0, 0));

    // A status table in another schema has a cleaner of its own.
    let other = testing::setup_with(
        Idem::builder(pool.clone())
            .schema("other_idem")
            .build()
            .unwrap(),
    )
    .await;
    let beside = other.purge_with(&Retention::new(7 * DAY)).await.unwrap();
    assert!(!beside.locked_out, "{beside:?}");

    let first = first.await.unwrap();
    assert!(!first.locked_out);
    assert_eq!(first.deleted, 60, "{first:?}");
    assert!(first.batches >= 12, "{first:?}");

    // The lock went with the first cleaner: the next one runs.
    let third = idem.purge_with(&Retention::new(7 * DAY)).await.unwrap();
    assert!(!third.locked_out, "{third:?}");
}

#[sqlx::test(migrations = false)]
async fn a_batch_that_times_out_is_halved_and_the_cleanup_gives_up_after_one_row(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let old = ids("old", 10);
    for id in &old {
        apply(&idem, &testing::paid(id, 1)).await.unwrap();
    }
    age_keys(&pool, "retention::apply", &old, 8 * DAY).await;

    // A table lock held elsewhere makes every batch wait until its statement timeout.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE idem.idem_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let retention = Retention::new(7 * DAY)
        .batch_size(8)
        .statement_timeout(Duration::from_millis(100));
    let report = idem.purge_with(&retention).await.unwrap();
    blocker.rollback().await.unwrap();
    // 8, 4, 2, 1: four batches timed out and rolled back.
    assert_eq!(report.timeouts, 4, "{report:?}");
    assert_eq!((report.deleted, report.batches), (0, 0), "{report:?}");
    assert!(!report.finished);

    // Unblocked, the next cleanup deletes everything, and the lock was released.
    let report = idem.purge_with(&retention).await.unwrap();
    assert_eq!(report.deleted, 10, "{report:?}");
}

#[sqlx::test(migrations = false)]
async fn the_background_cleanup_runs_until_stopped(pool: PgPool) {
    let idem = testing::setup_with(
        Idem::builder(pool.clone())
            .retention(
                Retention::new(7 * DAY)
                    .batch_size(10)
                    .interval(Duration::from_millis(50)),
            )
            .build()
            .unwrap(),
    )
    .await;
    let first = ids("first", 25);
    for id in &first {
        apply(&idem, &testing::paid(id, 1)).await.unwrap();
    }
    age_keys(&pool, "retention::apply", &first, 8 * DAY).await;
    let cleaner = idem.spawn_retention();
    let deadline = Instant::now() + Duration::from_secs(30);
    while keys_of(&pool, "retention::apply").await > 0 {
        assert!(
            Instant::now() < deadline,
            "the background cleanup did not run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Keys that age later are deleted by a later run.
    let later = ids("later", 5);
    for id in &later {
        apply(&idem, &testing::paid(id, 1)).await.unwrap();
    }
    age_keys(&pool, "retention::apply", &later, 8 * DAY).await;
    while keys_of(&pool, "retention::apply").await > 0 {
        assert!(
            Instant::now() < deadline,
            "the background cleanup stopped early"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cleaner.stop().await;

    // Stopped: old keys stay.
    let after = ids("after", 3);
    for id in &after {
        apply(&idem, &testing::paid(id, 1)).await.unwrap();
    }
    age_keys(&pool, "retention::apply", &after, 8 * DAY).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(keys_of(&pool, "retention::apply").await, 3);
}

/// Deliveries of new keys per second from `workers` tasks, until `stop` is set or `limit`
/// has passed; also returns how long they ran.
async fn claim_rate(
    idem: &Idem,
    workers: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    limit: Duration,
    tag: &str,
) -> (f64, Duration) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let (idem, tag, stop) = (idem.clone(), tag.to_owned(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while started.elapsed() < limit && !stop.load(Ordering::Relaxed) {
                let event = testing::paid(&format!("{tag}-{worker}-{done}"), 1);
                assert!(storm(&idem, &event).await.unwrap().is_executed());
                done += 1;
            }
            done
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.unwrap();
    }
    let elapsed = started.elapsed();
    (done as f64 / elapsed.as_secs_f64(), elapsed)
}

/// The cost of the cleanup on the claim path: deliveries of new keys per second from four
/// workers while a cleaner deletes a backlog of old keys (batches of 5,000, the default),
/// then for as long again without it, in two rounds. Prints the ratio.
///
/// ```text
/// cargo test -p idem-runtime --test retention -- --ignored --nocapture cleanup_cost
/// ```
///
/// `IDEM_CLEANUP_BENCH_BACKLOG` (default 300000) sets the old keys of each round,
/// `IDEM_CLEANUP_BENCH_PAUSE_MS` (default 0) a pause between the cleaner's batches.
#[sqlx::test(migrations = false)]
#[ignore = "a measurement: run it on purpose"]
async fn cleanup_cost_on_the_claim_path(pool: PgPool) {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let backlog = env("IDEM_CLEANUP_BENCH_BACKLOG", 300_000) as i64;
    let retention =
        Retention::default().pause(Duration::from_millis(env("IDEM_CLEANUP_BENCH_PAUSE_MS", 0)));
    let workers = 4;
    let idem = testing::setup(&pool).await;
    // Warm-up: handler registration, plans, the pool's connections.
    let never = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    claim_rate(
        &idem,
        workers,
        never.clone(),
        Duration::from_secs(1),
        "warm",
    )
    .await;
    let (mut alone, mut cleaning, mut deleted, mut cleaning_secs) =
        (Vec::new(), Vec::new(), 0, 0.0);
    for round in 0..2 {
        // The backlog: old successes of another scope, written directly.
        sqlx::query(
            "INSERT INTO idem.idem_keys (scope, key, status, attempts, created_at, updated_at) \
             SELECT 'retention::backlog', gen_random_uuid(), 'success', 1, \
                    now() - interval '30 days', now() - interval '30 days' \
             FROM generate_series(1, $1)",
        )
        .bind(backlog)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("VACUUM ANALYZE idem.idem_keys")
            .execute(&pool)
            .await
            .unwrap();

        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cleaner = {
            let (idem, retention, done) = (idem.clone(), retention.clone(), done.clone());
            tokio::spawn(async move {
                let report = idem.purge_with(&retention).await.unwrap();
                done.store(true, Ordering::Relaxed);
                report
            })
        };
        let (rate, took) = claim_rate(
            &idem,
            workers,
            done,
            Duration::from_secs(600),
            &format!("cleaning-{round}"),
        )
        .await;
        let report = cleaner.await.unwrap();
        assert!(
            report.finished && report.deleted == backlog as u64,
            "{report:?}"
        );
        cleaning.push(rate);
        deleted += report.deleted;
        cleaning_secs += took.as_secs_f64();
        // As long again, without a cleaner.
        let (rate, _) = claim_rate(
            &idem,
            workers,
            never.clone(),
            took,
            &format!("alone-{round}"),
        )
        .await;
        alone.push(rate);
    }
    let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
    println!(
        "claim path, {workers} workers: alone {alone:.0?}/s, while a cleaner deletes {cleaning:.0?}/s; \
         ratio {:.2}; the cleaner deleted {deleted} keys in {cleaning_secs:.1} s ({:.0}/s)",
        mean(&cleaning) / mean(&alone),
        deleted as f64 / cleaning_secs
    );
}

#[sqlx::test(migrations = false)]
async fn the_expiry_of_time_buckets_keeps_the_declared_windows_whoever_calls_it(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // A scope declares 30 days; a bucket holds facts of two days ago.
    assert!(
        declared(&idem, &testing::paid("kept", 1))
            .await
            .unwrap()
            .is_executed()
    );
    let made: String = sqlx::query_scalar(
        "SELECT idem.idem_timed_bucket(now() - interval '2 days', interval '1 hour', $1, 3600000)",
    )
    .bind(30 * 24 * 3600 * 1000_i64)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(made, "created");

    // A caller with a window of an hour (an operator's one-off call) expires nothing
    // that the declared window keeps.
    let expired: Option<String> = sqlx::query_scalar("SELECT idem.idem_timed_expire(3600000, 200)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(expired, None);
    let buckets: i64 = sqlx::query_scalar("SELECT count(*) FROM idem.idem_timed_buckets")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(buckets, 1);

    // A negative window would drop the bucket of the facts delivered now.
    for window in [-1_i64, -7_200_000] {
        let refused = sqlx::query("SELECT idem.idem_timed_expire($1, 200)")
            .bind(window)
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(
            refused
                .as_database_error()
                .and_then(|e| e.code())
                .as_deref(),
            Some("22023"),
            "{refused:?}"
        );
    }
}
