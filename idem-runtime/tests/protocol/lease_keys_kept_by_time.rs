//! Lease mode with keys kept by the fact's time (`event_time`): concurrent deliveries of
//! facts straddling a bucket boundary run each body once; a lease expires on the database
//! clock and a stale worker is fenced off (its completion, failure and extension refused);
//! a failure is recorded and parks the key in its bucket; a fact outside its window is
//! refused and never run. The keys are in the fact's bucket, none in the status table.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use idem_runtime::lease::{Lease, LeaseError};
use idem_runtime::{Disposition, Error, Idem, Outcome, WindowEdge, idempotent};
use sqlx::PgPool;
use tokio::time::timeout;
use uuid::Uuid;

use crate::support::testing::{self, Checkpoint};

const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
#[error("the mail service refused the message")]
struct Refused;

/// Each body's run: the order, the worker and the lease's token.
type Calls = Arc<Mutex<Vec<(String, &'static str, Uuid)>>>;

/// One worker's delivery of a notification of `order_id` at `at`.
#[derive(Clone)]
struct Job {
    order_id: String,
    at: DateTime<Utc>,
    worker: &'static str,
    /// Each body's run: the worker and the lease's token.
    calls: Calls,
    /// Where the worker stalls until released.
    stalls_at: Option<Checkpoint>,
    fails: bool,
    /// The worker's lease, kept by the test to act as the stale worker.
    lease: Arc<Mutex<Option<Lease>>>,
}

impl Job {
    fn new(order_id: &str, at: DateTime<Utc>, worker: &'static str) -> Self {
        Job {
            order_id: order_id.to_owned(),
            at,
            worker,
            calls: Arc::default(),
            stalls_at: None,
            fails: false,
            lease: Arc::default(),
        }
    }

    fn runs(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

#[idempotent(
    key = "order_id, at",
    event_time = "at",
    scope = "timed_notify",
    mode = "lease",
    lease = "1s",
    max_attempts = 2
)]
async fn notify(lease: &Lease, job: &Job) -> Result<String, Refused> {
    *job.lease.lock().unwrap() = Some(lease.clone());
    job.calls
        .lock()
        .unwrap()
        .push((job.order_id.clone(), job.worker, lease.token()));
    if let Some(checkpoint) = &job.stalls_at {
        checkpoint.reach().await;
    }
    if job.fails {
        return Err(Refused);
    }
    Ok(format!("sent {} by {}", job.order_id, job.worker))
}

fn micros(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::microseconds(1)).unwrap()
}

/// The row of `job`'s key in its bucket: status, attempts, whether its lease expired on
/// the database clock (`None`: no lease), the stored result.
async fn row(pool: &PgPool, job: &Job) -> Option<(String, i32, Option<bool>, Option<String>)> {
    let key = notify_key(job).unwrap();
    sqlx::query_as(
        "SELECT status, attempts, lease_expires_at <= now(), result::text \
         FROM idem.idem_timed_keys WHERE scope = 'timed_notify' AND key = $1 AND fact_time = $2",
    )
    .bind(key.key().as_uuid())
    .bind(key.fact_time().unwrap())
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// Waits until the lease on `job`'s key has expired on the database clock.
async fn wait_for_expiry(pool: &PgPool, job: &Job) {
    timeout(PATIENCE, async {
        while row(pool, job).await.and_then(|row| row.2) != Some(true) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the lease expires on the database clock");
}

async fn plain_keys(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem.idem_keys")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn concurrent_deliveries_across_a_bucket_boundary_run_each_body_once(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // Facts a few milliseconds either side of the start of the hour before this one.
    let boundary = (Utc::now() - TimeDelta::hours(1))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let jobs: Vec<Job> = (0..60_i64)
        .map(|i| Job {
            calls: calls.clone(),
            ..Job::new(
                &format!("o-{i}"),
                micros(boundary + TimeDelta::milliseconds(i - 30)),
                "w",
            )
        })
        .collect();
    let tasks: Vec<_> = (0..6_usize)
        .map(|task| {
            let (idem, mut jobs) = (idem.clone(), jobs.clone());
            jobs.rotate_left(task * 10);
            tokio::spawn(async move {
                let mut receipts = HashMap::new();
                for job in jobs {
                    let receipt = loop {
                        match notify(&idem, &job).await {
                            Ok(Outcome::Executed(receipt) | Outcome::Duplicate(Some(receipt))) => {
                                break receipt;
                            }
                            Err(Error::InProgress { .. }) => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            other => panic!("{}: {other:?}", job.order_id),
                        }
                    };
                    receipts.insert(job.order_id.clone(), receipt);
                }
                receipts
            })
        })
        .collect();
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await.unwrap());
    }
    assert!(receipts.windows(2).all(|pair| pair[0] == pair[1]));
    let mut runs: HashMap<String, usize> = HashMap::new();
    for (order_id, _, _) in calls.lock().unwrap().iter() {
        *runs.entry(order_id.clone()).or_default() += 1;
    }
    assert_eq!(runs.len(), jobs.len());
    assert!(runs.values().all(|&n| n == 1), "a body ran twice: {runs:?}");
    let buckets: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT tableoid) FROM idem.idem_timed_keys \
         WHERE scope = 'timed_notify' AND status = 'success' AND attempts = 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        buckets, 2,
        "the keys are in the buckets either side of the boundary"
    );
    assert_eq!(plain_keys(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn a_stale_worker_is_fenced_off_once_its_lease_expired_on_the_database_clock(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let at = micros(Utc::now() - TimeDelta::minutes(5));
    let checkpoint = Checkpoint::new();
    let stale = Job {
        stalls_at: Some(checkpoint.clone()),
        ..Job::new("o-stale", at, "a")
    };
    let stale_delivery = tokio::spawn({
        let (idem, stale) = (idem.clone(), stale.clone());
        async move { notify(&idem, &stale).await }
    });
    timeout(PATIENCE, checkpoint.reached()).await.unwrap();
    // Held: a delivery meanwhile is in progress, and runs nothing.
    let waiting = Job::new("o-stale", at, "w");
    let error = notify(&idem, &waiting).await.unwrap_err();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(waiting.runs(), 0);
    wait_for_expiry(&pool, &stale).await;

    // Worker b reclaims the expired lease and completes.
    let fresh = Job::new("o-stale", at, "b");
    assert_eq!(
        notify(&idem, &fresh).await.unwrap(),
        Outcome::Executed("sent o-stale by b".into())
    );
    // The stale worker can no longer extend its lease, nor complete.
    let stale_lease = stale.lease.lock().unwrap().clone().unwrap();
    assert!(matches!(
        stale_lease.extend(Duration::from_secs(5)).await,
        Err(LeaseError::Lost { .. })
    ));
    checkpoint.release();
    let refused = stale_delivery.await.unwrap().unwrap_err();
    assert!(matches!(refused, Error::LeaseLost { .. }), "{refused:?}");
    assert_eq!(
        row(&pool, &fresh).await,
        Some((
            "success".to_owned(),
            2,
            None,
            Some("\"sent o-stale by b\"".to_owned())
        ))
    );
    assert_eq!(
        notify(&idem, &Job::new("o-stale", at, "c")).await.unwrap(),
        Outcome::Duplicate(Some("sent o-stale by b".into()))
    );
    assert_eq!(plain_keys(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn a_live_lease_is_extended_and_a_failure_parks_the_key_in_its_bucket(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let at = micros(Utc::now() - TimeDelta::minutes(5));
    let checkpoint = Checkpoint::new();
    let held = Job {
        stalls_at: Some(checkpoint.clone()),
        fails: true,
        ..Job::new("o-failing", at, "a")
    };
    let delivery = tokio::spawn({
        let (idem, held) = (idem.clone(), held.clone());
        async move { notify(&idem, &held).await }
    });
    timeout(PATIENCE, checkpoint.reached()).await.unwrap();
    let lease = held.lease.lock().unwrap().clone().unwrap();
    lease.extend(Duration::from_secs(60)).await.unwrap();
    assert_eq!(row(&pool, &held).await.unwrap().2, Some(false));
    checkpoint.release();
    let error = delivery.await.unwrap().unwrap_err();
    assert!(
        matches!(
            error,
            Error::Handler {
                attempts: 1,
                parked: false,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(row(&pool, &held).await.unwrap().0, "failed");
    // The second attempt fails too: parked, and refused from then on.
    let again = Job {
        fails: true,
        ..Job::new("o-failing", at, "b")
    };
    let error = notify(&idem, &again).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Handler {
                attempts: 2,
                parked: true,
                ..
            }
        ),
        "{error:?}"
    );
    let error = notify(&idem, &Job::new("o-failing", at, "c"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Parked { .. }), "{error:?}");
    assert_eq!(row(&pool, &held).await.unwrap().0, "parked");
}

#[sqlx::test(migrations = false)]
async fn a_fact_outside_its_window_is_refused_and_never_run(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    for (at, edge) in [
        (Utc::now() - TimeDelta::days(30), WindowEdge::Past),
        (Utc::now() + TimeDelta::days(2), WindowEdge::Future),
    ] {
        let job = Job::new("o-outside", micros(at), "a");
        let error = notify(&idem, &job).await.unwrap_err();
        assert!(
            matches!(error, Error::OutsideWindow { edge: found, .. } if found == edge),
            "{error:?}"
        );
        assert_eq!(error.disposition(), Disposition::DeadLetter);
        assert_eq!(job.runs(), 0);
    }
    // A failed key whose fact left the window since is not run again either.
    let at = micros(Utc::now() - TimeDelta::minutes(5));
    let failing = Job {
        fails: true,
        ..Job::new("o-aged", at, "a")
    };
    assert!(notify(&idem, &failing).await.is_err());
    // A handle whose window is a minute: the fact, five minutes old, is outside it now.
    let short = Idem::builder(pool.clone())
        .retention(idem_runtime::retention::Retention::new(
            Duration::from_secs(60),
        ))
        .build()
        .unwrap();
    let late = Job::new("o-aged", at, "b");
    let error = notify(&short, &late).await.unwrap_err();
    assert!(matches!(error, Error::OutsideWindow { .. }), "{error:?}");
    assert_eq!(late.runs(), 0);
    assert_eq!(row(&pool, &failing).await.unwrap().0, "failed");
}
