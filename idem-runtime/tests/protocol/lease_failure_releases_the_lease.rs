//! Lease mode: a failed body records `failed`, the attempt and the error text, and releases the lease so that a retry claims at once.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::lease::Lease;
use idem_runtime::{Disposition, Error, Outcome, idempotent};
use sqlx::PgPool;

#[derive(Debug, thiserror::Error)]
#[error("the gateway answered 503")]
struct Unavailable;

#[derive(Debug, thiserror::Error)]
#[error("push to order {order_id} failed")]
struct PushFailed {
    order_id: String,
    #[source]
    source: Unavailable,
}

/// A push notification; `calls` counts the calls the gateway received.
struct Job<'a> {
    order_id: &'a str,
    calls: &'a AtomicUsize,
    gateway_down: &'a AtomicBool,
}

// A lease far longer than the test: only the released lease lets the retry in.
#[idempotent(
    key = "order_id",
    scope = "push",
    mode = "lease",
    lease = "1h",
    max_attempts = 5
)]
async fn push(lease: &Lease, job: &Job<'_>) -> Result<u32, PushFailed> {
    job.calls.fetch_add(1, Ordering::SeqCst);
    if job.gateway_down.load(Ordering::SeqCst) {
        return Err(PushFailed {
            order_id: job.order_id.to_owned(),
            source: Unavailable,
        });
    }
    Ok(lease.attempt())
}

fn key() -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", "o-fail")
        .unwrap()
        .finish()
}

async fn lease_released(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT lease_expires_at IS NULL FROM idem.idem_keys WHERE scope = 'push' AND key = $1",
    )
    .bind(key().as_uuid())
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_failure_is_recorded_and_the_retry_claims_at_once(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let (calls, gateway_down) = (AtomicUsize::new(0), AtomicBool::new(true));
    let job = Job {
        order_id: "o-fail",
        calls: &calls,
        gateway_down: &gateway_down,
    };

    for attempt in 1..=2 {
        let failed = push(&idem, &job).await.unwrap_err();
        let Error::Handler {
            source,
            attempts,
            parked,
        } = &failed
        else {
            panic!("expected a handler error, got {failed:?}");
        };
        assert_eq!(
            (source.order_id.as_str(), *attempts, *parked),
            ("o-fail", attempt, false)
        );
        assert_eq!(failed.disposition(), Disposition::Retry);

        let record = idem.record("push", key()).await.unwrap().unwrap();
        assert_eq!((record.status, record.attempts), (Status::Failed, attempt));
        assert_eq!(
            record.last_error.as_deref(),
            Some("push to order o-fail failed: the gateway answered 503")
        );
        assert!(
            lease_released(&pool).await,
            "the failed attempt kept its lease"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // The gateway is back: the retry runs at once (the 1h lease was released) and
    // succeeds as attempt 3.
    gateway_down.store(false, Ordering::SeqCst);
    assert_eq!(push(&idem, &job).await.unwrap(), Outcome::Executed(3));
    let record = idem.record("push", key()).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 3));
    assert_eq!(record.result, Some(serde_json::json!(3)));
    assert!(lease_released(&pool).await);

    assert_eq!(
        push(&idem, &job).await.unwrap(),
        Outcome::Duplicate(Some(3))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
