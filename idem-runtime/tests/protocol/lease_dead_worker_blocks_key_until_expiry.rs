//! Lease mode: a worker that dies mid-body blocks its key only until the lease expires; then another worker completes it.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::Lease;
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::PgPool;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

/// A notification to send; `sent` stands for the external system that receives it.
#[derive(Clone)]
struct Job {
    order_id: String,
    sent: Arc<AtomicUsize>,
    /// Where a dying worker stops for good.
    dies_at: Option<Checkpoint>,
}

#[idempotent(key = "order_id", scope = "notify", mode = "lease", lease = "1s")]
async fn notify(lease: &Lease, job: &Job) -> Result<u32, std::io::Error> {
    if let Some(checkpoint) = &job.dies_at {
        match checkpoint.reach_and_hang().await {}
    }
    job.sent.fetch_add(1, Ordering::SeqCst);
    Ok(lease.attempt())
}

fn key(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

fn jobs(order_id: &str) -> (Job, Job, Checkpoint) {
    let sent = Arc::new(AtomicUsize::new(0));
    let checkpoint = Checkpoint::new();
    let dying = Job {
        order_id: order_id.into(),
        sent: sent.clone(),
        dies_at: Some(checkpoint.clone()),
    };
    let healthy = Job {
        order_id: order_id.into(),
        sent,
        dies_at: None,
    };
    (dying, healthy, checkpoint)
}

/// After the dying worker is gone: the key is blocked while its lease is live, and
/// taken over by the next delivery as soon as the lease has expired.
async fn blocked_until_expiry_then_completed(pool: &PgPool, idem: &Idem, healthy: &Job) {
    let key = key(&healthy.order_id);
    let refused = notify(idem, healthy).await.unwrap_err();
    assert!(matches!(refused, Error::InProgress { .. }), "{refused:?}");
    let record = idem.record("notify", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Processing, 1));
    assert_eq!(healthy.sent.load(Ordering::SeqCst), 0);

    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "notify", key).await;
    assert_eq!(notify(idem, healthy).await.unwrap(), Outcome::Executed(2));
    assert_eq!(healthy.sent.load(Ordering::SeqCst), 1);
    let record = idem.record("notify", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 2));
    // Taken over no sooner than the lease allowed, on the database's clock.
    assert!(record.updated_at - record.created_at >= chrono::Duration::seconds(1));

    assert_eq!(
        notify(idem, healthy).await.unwrap(),
        Outcome::Duplicate(Some(2))
    );
    assert_eq!(healthy.sent.load(Ordering::SeqCst), 1);
}

#[sqlx::test(migrations = false)]
async fn a_delivery_dropped_by_its_timeout_blocks_the_key_until_the_lease_expires(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let (dying, healthy, checkpoint) = jobs("o-dropped");

    let mut delivery = Box::pin(notify(&idem, &dying));
    tokio::select! {
        () = checkpoint.reached() => {}
        outcome = &mut delivery => panic!("the dying delivery returned: {outcome:?}"),
    }
    // Mid-body, the caller's timeout fires and drops the delivery's future.
    let dropped = timeout(Duration::from_millis(50), delivery).await;
    assert!(dropped.is_err(), "the dying delivery returned: {dropped:?}");

    blocked_until_expiry_then_completed(&pool, &idem, &healthy).await;
}

#[sqlx::test(migrations = false)]
async fn an_aborted_task_blocks_the_key_until_the_lease_expires(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let (dying, healthy, checkpoint) = jobs("o-aborted");

    let task = tokio::spawn({
        let idem = idem.clone();
        async move { notify(&idem, &dying).await }
    });
    timeout(PATIENCE, checkpoint.reached()).await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());

    blocked_until_expiry_then_completed(&pool, &idem, &healthy).await;
}

#[sqlx::test(migrations = false)]
async fn racing_workers_take_over_an_expired_lease_once(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let (dying, healthy, checkpoint) = jobs("o-race");
    let task = tokio::spawn({
        let idem = idem.clone();
        async move { notify(&idem, &dying).await }
    });
    timeout(PATIENCE, checkpoint.reached()).await.unwrap();
    task.abort();
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "notify", key("o-race")).await;

    // Eight workers find the expired lease at once: one takes the key over, the others
    // see its fresh lease, or its success.
    let deliveries = (0..8).map(|_| {
        let (idem, healthy) = (idem.clone(), healthy.clone());
        tokio::spawn(async move { notify(&idem, &healthy).await })
    });
    let mut executed = 0;
    for delivery in deliveries.collect::<Vec<_>>() {
        match delivery.await.unwrap() {
            Ok(Outcome::Executed(attempt)) => {
                assert_eq!(attempt, 2);
                executed += 1;
            }
            Ok(Outcome::Duplicate(Some(2))) | Err(Error::InProgress { .. }) => {}
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(healthy.sent.load(Ordering::SeqCst), 1);
    let record = idem.record("notify", key("o-race")).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 2));
}
