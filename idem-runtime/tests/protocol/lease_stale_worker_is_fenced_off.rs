//! Lease mode: a stale worker whose lease was reclaimed cannot complete, fail or extend; the newer outcome stands.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::{Lease, LeaseError};
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use sqlx::PgPool;
use tokio::time::timeout;
use uuid::Uuid;

const PATIENCE: Duration = Duration::from_secs(30);

/// Stands for the external system: what it received, with the fencing token of each call.
type Mailbox = Arc<Mutex<Vec<(&'static str, Uuid)>>>;

#[derive(Debug, thiserror::Error)]
#[error("the mail service refused the message")]
struct Refused;

/// One worker's delivery of the notification.
#[derive(Clone)]
struct Job {
    order_id: &'static str,
    worker: &'static str,
    mailbox: Mailbox,
    /// Where the worker stalls (a long GC pause, a slow network) until released.
    stalls_at: Option<Checkpoint>,
    fails: bool,
    /// The worker's lease, kept by the test to act as the stale worker.
    lease: Arc<Mutex<Option<Lease>>>,
}

impl Job {
    fn new(worker: &'static str, mailbox: &Mailbox) -> Self {
        Job {
            order_id: "o-stale",
            worker,
            mailbox: mailbox.clone(),
            stalls_at: None,
            fails: false,
            lease: Arc::default(),
        }
    }
}

#[idempotent(key = "order_id", scope = "notify", mode = "lease", lease = "1s")]
async fn notify(lease: &Lease, job: &Job) -> Result<String, Refused> {
    *job.lease.lock().unwrap() = Some(lease.clone());
    job.mailbox
        .lock()
        .unwrap()
        .push((job.worker, lease.token()));
    if let Some(checkpoint) = &job.stalls_at {
        checkpoint.reach().await;
    }
    if job.fails {
        return Err(Refused);
    }
    Ok(format!("sent by {}", job.worker))
}

fn key() -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", "o-stale")
        .unwrap()
        .finish()
}

#[sqlx::test(migrations = false)]
async fn a_stale_completion_after_reclaim_is_refused_and_the_newer_outcome_stands(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let mailbox = Mailbox::default();
    let checkpoint = Checkpoint::new();
    let stale = Job {
        stalls_at: Some(checkpoint.clone()),
        ..Job::new("a", &mailbox)
    };

    let stale_delivery = tokio::spawn({
        let (idem, stale) = (idem.clone(), stale.clone());
        async move { notify(&idem, &stale).await }
    });
    timeout(PATIENCE, checkpoint.reached()).await.unwrap();
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "notify", key()).await;

    // Worker b reclaims the expired lease and completes.
    let fresh = Job::new("b", &mailbox);
    assert_eq!(
        notify(&idem, &fresh).await.unwrap(),
        Outcome::Executed("sent by b".into())
    );

    // Worker a wakes up and tries to mark its success: refused and reported.
    checkpoint.release();
    let refused = stale_delivery.await.unwrap().unwrap_err();
    assert!(
        matches!(refused, Error::LeaseLost { key: lost } if lost == key()),
        "{refused:?}"
    );
    assert_eq!(refused.disposition(), Disposition::Retry);

    let record = idem.record("notify", key()).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 2));
    assert_eq!(record.result, Some(serde_json::json!("sent by b")));
    assert_eq!(
        notify(&idem, &Job::new("c", &mailbox)).await.unwrap(),
        Outcome::Duplicate(Some("sent by b".into()))
    );

    // The effect itself ran twice (at-least-once), each call with its own fencing token:
    // what the external system needs to refuse the stale call.
    let calls = mailbox.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(|(worker, _)| *worker).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_ne!(calls[0].1, calls[1].1);
}

#[sqlx::test(migrations = false)]
async fn a_stale_failure_after_reclaim_is_refused_and_does_not_touch_the_key(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let mailbox = Mailbox::default();
    let (stale_checkpoint, fresh_checkpoint) = (Checkpoint::new(), Checkpoint::new());
    let stale = Job {
        stalls_at: Some(stale_checkpoint.clone()),
        fails: true,
        ..Job::new("a", &mailbox)
    };
    let fresh = Job {
        stalls_at: Some(fresh_checkpoint.clone()),
        ..Job::new("b", &mailbox)
    };

    let stale_delivery = tokio::spawn({
        let (idem, stale) = (idem.clone(), stale.clone());
        async move { notify(&idem, &stale).await }
    });
    timeout(PATIENCE, stale_checkpoint.reached()).await.unwrap();
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "notify", key()).await;
    let fresh_delivery = tokio::spawn({
        let (idem, fresh) = (idem.clone(), fresh.clone());
        async move { notify(&idem, &fresh).await }
    });
    timeout(PATIENCE, fresh_checkpoint.reached()).await.unwrap();

    // While b holds the key, a's failure is refused: no `failed`, no attempt counted, and
    // b's lease stays in force.
    stale_checkpoint.release();
    let refused = stale_delivery.await.unwrap().unwrap_err();
    assert!(matches!(refused, Error::LeaseLost { .. }), "{refused:?}");
    let record = idem.record("notify", key()).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Processing, 2));
    assert_eq!(record.last_error, None);
    let in_progress = notify(&idem, &Job::new("c", &mailbox)).await.unwrap_err();
    assert!(
        matches!(in_progress, Error::InProgress { .. }),
        "{in_progress:?}"
    );

    fresh_checkpoint.release();
    assert!(fresh_delivery.await.unwrap().unwrap().is_executed());
    let record = idem.record("notify", key()).await.unwrap().unwrap();
    assert_eq!((record.status, record.last_error), (Status::Success, None));
}

#[sqlx::test(migrations = false)]
async fn a_stale_lease_cannot_be_extended_after_reclaim(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let mailbox = Mailbox::default();
    let checkpoint = Checkpoint::new();
    let stale = Job {
        stalls_at: Some(checkpoint.clone()),
        ..Job::new("a", &mailbox)
    };

    let stale_delivery = tokio::spawn({
        let (idem, stale) = (idem.clone(), stale.clone());
        async move { notify(&idem, &stale).await }
    });
    timeout(PATIENCE, checkpoint.reached()).await.unwrap();
    let stale_lease = stale.lease.lock().unwrap().clone().unwrap();
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "notify", key()).await;
    // Expired but not reclaimed yet: the owner may still extend, and keeps the key.
    stale_lease.extend(Duration::from_secs(1)).await.unwrap();
    let in_progress = notify(&idem, &Job::new("b", &mailbox)).await.unwrap_err();
    assert!(
        matches!(in_progress, Error::InProgress { .. }),
        "{in_progress:?}"
    );

    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "notify", key()).await;
    let fresh = Job::new("b", &mailbox);
    assert!(notify(&idem, &fresh).await.unwrap().is_executed());

    // Reclaimed: the stale owner can no longer extend.
    let lost = stale_lease
        .extend(Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(lost, LeaseError::Lost { key: lost } if lost == key()),
        "{lost:?}"
    );
    assert_eq!(stale_lease.attempt(), 1);
    assert_eq!(fresh.lease.lock().unwrap().as_ref().unwrap().attempt(), 2);

    checkpoint.release();
    let refused = stale_delivery.await.unwrap().unwrap_err();
    assert!(matches!(refused, Error::LeaseLost { .. }), "{refused:?}");
    let record = idem.record("notify", key()).await.unwrap().unwrap();
    assert_eq!(record.result, Some(serde_json::json!("sent by b")));
}
