//! Lease mode: a delivery whose payload differs from the key's first one is rejected without running the body or changing the key, whatever state the key is in.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::testing::{self, Checkpoint};
use idem_runtime::key::{IdempotencyKey, KeyBuilder};
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use idem_runtime::{KeyRecord, Status};
use sqlx::PgPool;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
#[error("refund of order {0} declined")]
struct Declined(String);

/// A refund to request from the payment provider; `calls` counts the requests it got.
struct Refund<'a> {
    order_id: &'a str,
    amount_cents: i64,
    declined: bool,
    calls: &'a AtomicUsize,
    /// Where the worker dies mid-body, if it does.
    dies_at: Option<Checkpoint>,
}

impl<'a> Refund<'a> {
    fn new(order_id: &'a str, amount_cents: i64, calls: &'a AtomicUsize) -> Self {
        Refund {
            order_id,
            amount_cents,
            declined: false,
            calls,
            dies_at: None,
        }
    }
}

#[idempotent(
    key = "order_id",
    scope = "refund",
    fingerprint = "amount_cents",
    mode = "lease",
    lease = "1s",
    max_attempts = 3
)]
async fn refund(request: &Refund<'_>) -> Result<i64, Declined> {
    request.calls.fetch_add(1, Ordering::SeqCst);
    if let Some(checkpoint) = &request.dies_at {
        match checkpoint.reach_and_hang().await {}
    }
    if request.declined {
        return Err(Declined(request.order_id.to_owned()));
    }
    Ok(request.amount_cents)
}

fn key(order_id: &str) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

/// Delivers `other` and expects a payload mismatch that leaves the key's row as it was.
async fn assert_rejected(idem: &Idem, other: &Refund<'_>) -> KeyRecord {
    let before = idem
        .record("refund", key(other.order_id))
        .await
        .unwrap()
        .unwrap();
    let calls = other.calls.load(Ordering::SeqCst);
    let refused = refund(idem, other).await.unwrap_err();
    assert!(
        matches!(refused, Error::PayloadMismatch { key: refused_key } if refused_key == key(other.order_id)),
        "{refused:?}"
    );
    assert_eq!(refused.disposition(), Disposition::DeadLetter);
    assert_eq!(
        other.calls.load(Ordering::SeqCst),
        calls,
        "a mismatched delivery ran the body"
    );
    let after = idem
        .record("refund", key(other.order_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, before, "a mismatched delivery changed the key");
    after
}

#[sqlx::test(migrations = false)]
async fn a_mismatch_after_success_is_rejected(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = AtomicUsize::new(0);
    let first = Refund::new("o-done", 500, &calls);
    assert_eq!(refund(&idem, &first).await.unwrap(), Outcome::Executed(500));

    assert_rejected(&idem, &Refund::new("o-done", 900, &calls)).await;
    // The same payload is still a duplicate.
    assert_eq!(
        refund(&idem, &first).await.unwrap(),
        Outcome::Duplicate(Some(500))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[sqlx::test(migrations = false)]
async fn a_mismatch_after_a_failure_does_not_claim_the_key(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = AtomicUsize::new(0);
    let declined = Refund {
        declined: true,
        ..Refund::new("o-failed", 500, &calls)
    };
    let failed = refund(&idem, &declined).await.unwrap_err();
    assert!(
        matches!(failed, Error::Handler { attempts: 1, .. }),
        "{failed:?}"
    );

    let record = assert_rejected(&idem, &Refund::new("o-failed", 900, &calls)).await;
    assert_eq!((record.status, record.attempts), (Status::Failed, 1));
    // The original payload retries as usual.
    let retry = Refund::new("o-failed", 500, &calls);
    assert_eq!(refund(&idem, &retry).await.unwrap(), Outcome::Executed(500));
}

#[sqlx::test(migrations = false)]
async fn a_mismatch_during_a_live_lease_is_rejected(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = AtomicUsize::new(0);
    let checkpoint = Checkpoint::new();
    let dying = Refund {
        dies_at: Some(checkpoint.clone()),
        ..Refund::new("o-live", 500, &calls)
    };
    let mut delivery = Box::pin(refund(&idem, &dying));
    tokio::select! {
        () = checkpoint.reached() => {}
        outcome = &mut delivery => panic!("the delivery returned: {outcome:?}"),
    }

    // Not "in progress": retrying a different payload can never succeed.
    let record = assert_rejected(&idem, &Refund::new("o-live", 900, &calls)).await;
    assert_eq!((record.status, record.attempts), (Status::Processing, 1));
    drop(delivery);
}

#[sqlx::test(migrations = false)]
async fn a_mismatch_on_an_expired_lease_neither_claims_nor_parks_the_key(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = AtomicUsize::new(0);
    let checkpoint = Checkpoint::new();
    let dying = Refund {
        dies_at: Some(checkpoint.clone()),
        ..Refund::new("o-expired", 500, &calls)
    };
    {
        let mut delivery = Box::pin(refund(&idem, &dying));
        tokio::select! {
            () = checkpoint.reached() => {}
            outcome = &mut delivery => panic!("the delivery returned: {outcome:?}"),
            () = tokio::time::sleep(PATIENCE) => panic!("the delivery never ran its body"),
        }
    }
    testing::wait_for_lease_expiry(&Idem::new(pool.clone()), "refund", key("o-expired")).await;

    // The key has attempts left (1 of 3): a mismatched delivery must leave it claimable.
    let record = assert_rejected(&idem, &Refund::new("o-expired", 900, &calls)).await;
    assert_eq!((record.status, record.attempts), (Status::Processing, 1));

    let retry = Refund::new("o-expired", 500, &calls);
    let retried = timeout(PATIENCE, refund(&idem, &retry)).await.unwrap();
    assert_eq!(retried.unwrap(), Outcome::Executed(500));
    let record = idem
        .record("refund", key("o-expired"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 2));
}
