//! A scope whose keys are kept by the fact's time (`event_time`): a duplicate of a
//! committed fact is answered from Redis (PostgreSQL is not queried: its pool is closed),
//! in transaction and in lease mode; the entry is the fact's key, as for any scope.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicU32, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use chrono::{DurationRound, TimeDelta, Utc};
use idem_runtime::lease::Lease;
use idem_runtime::{Error, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

static RUNS: AtomicU32 = AtomicU32::new(0);
static SENT: AtomicU32 = AtomicU32::new(0);

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "cached_timed_pay"
)]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, event).await
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "cached_timed_notify",
    mode = "lease"
)]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<String, std::io::Error> {
    SENT.fetch_add(1, Ordering::SeqCst);
    Ok(format!("sent {} ({})", event.order_id, lease.attempt()))
}

#[sqlx::test(migrations = false)]
async fn a_duplicate_of_a_time_bucketed_fact_is_answered_from_redis(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let mut event = testing::paid("o-timed", 700);
    event.occurred_at = (Utc::now() - TimeDelta::minutes(10))
        .duration_trunc(TimeDelta::microseconds(1))
        .unwrap();

    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    let Outcome::Executed(sent) = notify(&idem, &event).await.unwrap() else {
        panic!("the first lease delivery executes");
    };
    redis_support::written(&idem, 2).await;
    // The key is in the fact's bucket, not in the status table; the entry is its key.
    let bucketed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem.idem_timed_keys WHERE fact_time = $1 AND status = 'success'",
    )
    .bind(event.occurred_at)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(bucketed, 2);
    let key = pay_key(&event).unwrap();
    assert_eq!(key.fact_time(), Some(event.occurred_at));
    redis_support::entry_name(&idem, &prefix, "cached_timed_pay", key.key()).await;

    // From here on, any query to PostgreSQL fails.
    pool.close().await;
    for _ in 0..3 {
        assert_eq!(
            pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
        assert_eq!(
            notify(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(sent.clone()))
        );
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(SENT.load(Ordering::SeqCst), 1, "the effect ran once");
    assert_eq!(redis_support::stats(&idem).hits, 6);
    // A fact that Redis does not know goes to PostgreSQL, and fails there.
    let unknown = OrderEvent {
        order_id: "o-not-cached".into(),
        ..event
    };
    assert!(matches!(
        pay(&idem, &unknown).await,
        Err(Error::Database(_))
    ));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
