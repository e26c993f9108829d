//! Lease mode: a key is parked after `max_attempts` failures, or after `max_attempts` leases that expired; parked keys run no body until reset.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::Lease;
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use sqlx::PgPool;

const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
#[error("webhook of order {0} rejected")]
struct Rejected(String);

/// How a delivery's body behaves.
#[derive(Clone, Copy)]
enum Behaviour {
    Succeeds,
    Fails,
    /// The worker dies mid-body: the body never returns.
    Dies,
}

struct Job<'a> {
    order_id: &'a str,
    behaviour: Behaviour,
    runs: &'a AtomicUsize,
    dies_at: Checkpoint,
}

impl<'a> Job<'a> {
    fn new(order_id: &'a str, behaviour: Behaviour, runs: &'a AtomicUsize) -> Self {
        Job {
            order_id,
            behaviour,
            runs,
            dies_at: Checkpoint::new(),
        }
    }
}

#[idempotent(
    key = "order_id",
    scope = "call_webhook",
    mode = "lease",
    lease = "1s",
    max_attempts = 2
)]
async fn call_webhook(lease: &Lease, job: &Job<'_>) -> Result<u32, Rejected> {
    job.runs.fetch_add(1, Ordering::SeqCst);
    match job.behaviour {
        Behaviour::Succeeds => Ok(lease.attempt()),
        Behaviour::Fails => Err(Rejected(job.order_id.to_owned())),
        Behaviour::Dies => match job.dies_at.reach_and_hang().await {},
    }
}

/// Without `max_attempts`: the runtime's setting applies.
#[idempotent(
    key = "order_id",
    mode = "lease",
    lease = "1s",
    scope = "crashing_webhook"
)]
async fn call_webhook_with_default_attempts(job: &Job<'_>) -> Result<u32, Rejected> {
    job.runs.fetch_add(1, Ordering::SeqCst);
    match job.behaviour {
        Behaviour::Succeeds => Ok(0),
        Behaviour::Fails => Err(Rejected(job.order_id.to_owned())),
        Behaviour::Dies => match job.dies_at.reach_and_hang().await {},
    }
}

fn key(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

fn assert_parked<E: std::fmt::Debug>(
    refused: &Error<E>,
    key: IdempotencyKey,
    attempts: u32,
    last_error: &str,
) {
    let Error::Parked {
        key: parked_key,
        attempts: parked_attempts,
        last_error: parked_error,
    } = refused
    else {
        panic!("expected a parked key, got {refused:?}");
    };
    assert_eq!((*parked_key, *parked_attempts), (key, attempts));
    assert_eq!(parked_error, last_error);
    assert_eq!(refused.disposition(), Disposition::DeadLetter);
}

/// Starts a delivery whose worker dies mid-body, and drops it there.
async fn die_mid_body<F: std::future::Future>(delivery: F, job: &Job<'_>) {
    let mut delivery = Box::pin(delivery);
    tokio::select! {
        () = job.dies_at.reached() => {}
        _ = &mut delivery => panic!("the dying delivery returned"),
        () = tokio::time::sleep(PATIENCE) => panic!("the dying delivery never ran its body"),
    }
}

#[sqlx::test(migrations = false)]
async fn a_key_is_parked_after_max_attempts_failures_until_reset(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let runs = AtomicUsize::new(0);
    let failing = Job::new("o-fails", Behaviour::Fails, &runs);

    let first = call_webhook(&idem, &failing).await.unwrap_err();
    assert!(
        matches!(
            first,
            Error::Handler {
                attempts: 1,
                parked: false,
                ..
            }
        ),
        "{first:?}"
    );
    let second = call_webhook(&idem, &failing).await.unwrap_err();
    assert!(
        matches!(
            second,
            Error::Handler {
                attempts: 2,
                parked: true,
                ..
            }
        ),
        "{second:?}"
    );
    assert_eq!(second.disposition(), Disposition::DeadLetter);
    let record = idem
        .record("call_webhook", key("o-fails"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.status, record.attempts), (Status::Parked, 2));

    // Parked: refused without running the body, even a delivery that would succeed.
    let healthy = Job::new("o-fails", Behaviour::Succeeds, &runs);
    for job in [&failing, &healthy] {
        let refused = call_webhook(&idem, job).await.unwrap_err();
        assert_parked(
            &refused,
            key("o-fails"),
            2,
            "webhook of order o-fails rejected",
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    assert!(idem.reset("call_webhook", key("o-fails")).await.unwrap());
    assert_eq!(
        call_webhook(&idem, &healthy).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[sqlx::test(migrations = false)]
async fn a_key_whose_leases_keep_expiring_is_parked_after_max_attempts(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let runs = AtomicUsize::new(0);

    // Two workers in a row die mid-body; the second takes over the first's expired lease.
    for attempt in 1..=2 {
        let dying = Job::new("o-crashes", Behaviour::Dies, &runs);
        die_mid_body(call_webhook(&idem, &dying), &dying).await;
        let record = idem
            .record("call_webhook", key("o-crashes"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (record.status, record.attempts),
            (Status::Processing, attempt)
        );
        testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "call_webhook", key("o-crashes"))
            .await;
    }

    // Its second lease expired too: max_attempts = 2 executions used up. The next
    // delivery parks the key instead of running the body a third time.
    let healthy = Job::new("o-crashes", Behaviour::Succeeds, &runs);
    let refused = call_webhook(&idem, &healthy).await.unwrap_err();
    let expired = "the lease expired before the handler completed";
    assert_parked(&refused, key("o-crashes"), 2, expired);
    let record = idem
        .record("call_webhook", key("o-crashes"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.status, record.attempts), (Status::Parked, 2));
    assert_eq!(record.last_error.as_deref(), Some(expired));
    let again = call_webhook(&idem, &healthy).await.unwrap_err();
    assert_parked(&again, key("o-crashes"), 2, expired);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    assert!(idem.reset("call_webhook", key("o-crashes")).await.unwrap());
    assert_eq!(
        call_webhook(&idem, &healthy).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[sqlx::test(migrations = false)]
async fn expiries_and_failures_count_against_the_runtime_max_attempts(pool: PgPool) {
    let idem =
        testing::setup_with(Idem::builder(pool.clone()).max_attempts(3).build().unwrap()).await;
    let runs = AtomicUsize::new(0);
    let scope = "crashing_webhook";

    // Attempt 1 dies, attempt 2 fails, attempt 3 dies.
    let dying = Job::new("o-mixed", Behaviour::Dies, &runs);
    die_mid_body(call_webhook_with_default_attempts(&idem, &dying), &dying).await;
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), scope, key("o-mixed")).await;
    let failing = Job::new("o-mixed", Behaviour::Fails, &runs);
    let failed = call_webhook_with_default_attempts(&idem, &failing)
        .await
        .unwrap_err();
    assert!(
        matches!(
            failed,
            Error::Handler {
                attempts: 2,
                parked: false,
                ..
            }
        ),
        "{failed:?}"
    );
    let dying = Job::new("o-mixed", Behaviour::Dies, &runs);
    die_mid_body(call_webhook_with_default_attempts(&idem, &dying), &dying).await;
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), scope, key("o-mixed")).await;

    // The last recorded error is kept: it says more than the expiry.
    let healthy = Job::new("o-mixed", Behaviour::Succeeds, &runs);
    let refused = call_webhook_with_default_attempts(&idem, &healthy)
        .await
        .unwrap_err();
    assert_parked(
        &refused,
        key("o-mixed"),
        3,
        "webhook of order o-mixed rejected",
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
