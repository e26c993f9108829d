//! Failed and parked keys are never written to Redis: their next delivery goes to PostgreSQL and runs the body again; only the success is cached.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Error, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

static FAIL: AtomicBool = AtomicBool::new(true);
static RUNS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
#[error("the payment provider said no")]
struct Declined;

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error(transparent)]
    Declined(#[from] Declined),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[idempotent(key = "order_id", scope = "flaky_pay")]
async fn flaky_pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, PayError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let id = testing::insert_effect(tx, event).await?;
    if FAIL.load(Ordering::SeqCst) {
        return Err(Declined.into());
    }
    Ok(id)
}

#[idempotent(key = "order_id", scope = "doomed_pay", max_attempts = 1)]
async fn doomed_pay(_tx: &mut PgConnection, _event: &OrderEvent) -> Result<i64, Declined> {
    Err(Declined)
}

#[sqlx::test(migrations = false)]
async fn failed_and_parked_keys_are_not_cached(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let url = redis_support::redis_url();
    let event = testing::paid("o-flaky", 300);

    for attempt in 1..=2 {
        let error = flaky_pay(&idem, &event).await.unwrap_err();
        assert!(
            matches!(error, Error::Handler { attempts, parked: false, .. } if attempts == attempt)
        );
        assert!(redis_support::names_under(&url, &prefix).await.is_empty());
    }
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        2,
        "each failed key's delivery ran the body"
    );
    assert_eq!(redis_support::stats(&idem).writes, 0);

    // Parked after its only attempt: refused by PostgreSQL, never cached.
    let doomed = testing::paid("o-doomed", 300);
    assert!(matches!(
        doomed_pay(&idem, &doomed).await,
        Err(Error::Handler { parked: true, .. })
    ));
    assert!(matches!(
        doomed_pay(&idem, &doomed).await,
        Err(Error::Parked { .. })
    ));
    assert!(redis_support::names_under(&url, &prefix).await.is_empty());

    // The success is cached, and its duplicate is answered from Redis.
    FAIL.store(false, Ordering::SeqCst);
    let Outcome::Executed(id) = flaky_pay(&idem, &event).await.unwrap() else {
        panic!("the third delivery executes");
    };
    redis_support::written(&idem, 1).await;
    assert_eq!(redis_support::names_under(&url, &prefix).await.len(), 1);
    let hits = redis_support::stats(&idem).hits;
    assert_eq!(
        flaky_pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(redis_support::stats(&idem).hits, hits + 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
