//! Lease mode: duplicates delivered while a lease is live get `InProgress` and the body runs once.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::Lease;
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio::time::timeout;

const DELIVERIES: usize = 16;
const PATIENCE: Duration = Duration::from_secs(30);

/// A notification to send; `sent` stands for the external system that receives it.
#[derive(Clone)]
struct Job {
    order_id: String,
    sent: Arc<AtomicUsize>,
    gate: Checkpoint,
}

#[idempotent(key = "order_id", scope = "notify", mode = "lease", lease = "30s")]
async fn notify(lease: &Lease, job: &Job) -> Result<String, std::io::Error> {
    job.sent.fetch_add(1, Ordering::SeqCst);
    // Hold the lease until the test has seen every duplicate refused.
    job.gate.reach().await;
    Ok(format!("sent {} with {}", job.order_id, lease.token()))
}

fn key(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

/// A second worker process: its own handle over its own pool.
async fn other_worker(pool: &PgPool) -> Idem {
    let options = pool.connect_options().as_ref().clone();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    Idem::new(pool)
}

#[sqlx::test(migrations = false)]
async fn racing_deliveries_run_the_body_once_and_the_rest_get_in_progress(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let other = other_worker(&pool).await;
    let job = Job {
        order_id: "o-race".into(),
        sent: Arc::new(AtomicUsize::new(0)),
        gate: Checkpoint::new(),
    };

    // All deliveries race for the claim, half of them from another worker's pool.
    let (results, mut received) = mpsc::unbounded_channel();
    for delivery in 0..DELIVERIES {
        let worker = if delivery % 2 == 0 {
            idem.clone()
        } else {
            other.clone()
        };
        let (job, results) = (job.clone(), results.clone());
        tokio::spawn(async move {
            let _ = results.send(notify(&worker, &job).await);
        });
    }

    // The winner sits in its body, holding a live lease; every other delivery returns.
    timeout(PATIENCE, job.gate.reached())
        .await
        .expect("no delivery ran the body");
    for _ in 1..DELIVERIES {
        let refused = timeout(PATIENCE, received.recv())
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(refused, Error::InProgress { key: refused_key } if refused_key == key("o-race")),
            "{refused:?}"
        );
        assert_eq!(refused.disposition(), Disposition::Retry);
    }
    assert_eq!(job.sent.load(Ordering::SeqCst), 1);
    let record = idem.record("notify", key("o-race")).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Processing, 1));

    job.gate.release();
    let executed = timeout(PATIENCE, received.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Outcome::Executed(receipt) = executed else {
        panic!("the winner did not execute: {executed:?}");
    };
    assert_eq!(
        job.sent.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );

    // After the winner's success, later deliveries are duplicates with its result.
    for worker in [&idem, &other] {
        assert_eq!(
            notify(worker, &job).await.unwrap(),
            Outcome::Duplicate(Some(receipt.clone()))
        );
    }
    assert_eq!(job.sent.load(Ordering::SeqCst), 1);
    let record = idem.record("notify", key("o-race")).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
}

#[sqlx::test(migrations = false)]
async fn a_duplicate_is_in_progress_for_as_long_as_the_lease_is_live(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let other = other_worker(&pool).await;
    let job = Job {
        order_id: "o-live".into(),
        sent: Arc::new(AtomicUsize::new(0)),
        gate: Checkpoint::new(),
    };

    let first = tokio::spawn({
        let (idem, job) = (idem.clone(), job.clone());
        async move { notify(&idem, &job).await }
    });
    timeout(PATIENCE, job.gate.reached()).await.unwrap();

    // Each redelivery, from either worker, is refused without running the body.
    for round in 0..3 {
        for worker in [&idem, &other] {
            let refused = notify(worker, &job).await.unwrap_err();
            assert!(
                matches!(refused, Error::InProgress { .. }),
                "round {round}: {refused:?}"
            );
        }
    }
    assert_eq!(job.sent.load(Ordering::SeqCst), 1);

    job.gate.release();
    assert!(first.await.unwrap().unwrap().is_executed());
    assert!(notify(&other, &job).await.unwrap().is_duplicate());
    assert_eq!(job.sent.load(Ordering::SeqCst), 1);
}
