//! A cached key delivered with another payload is not answered from Redis: PostgreSQL answers it with the payload mismatch.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Error, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", fingerprint = "amount_cents", scope = "fp_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_cached_key_with_another_payload_is_a_mismatch(pool: PgPool) {
    let (idem, _prefix) = redis_support::setup(&pool).await;
    let event = testing::paid("o-fp", 500);
    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    redis_support::written(&idem, 1).await;
    assert_eq!(
        pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(redis_support::stats(&idem).hits, 1);

    let altered = testing::paid("o-fp", 501);
    assert!(matches!(
        pay(&idem, &altered).await,
        Err(Error::PayloadMismatch { .. })
    ));
    let stats = redis_support::stats(&idem);
    assert_eq!(
        stats.hits, 1,
        "the altered payload was not answered from Redis"
    );
    assert_eq!(stats.misses, 2, "the first delivery and the altered one");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);

    // The original payload is still answered from Redis.
    assert_eq!(
        pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(redis_support::stats(&idem).hits, 2);
}
