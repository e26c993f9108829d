//! A duplicate that PostgreSQL answers with `success` writes the key to Redis, so that the next duplicate is answered from Redis.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "warm_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn postgres_duplicate_warms_the_cache(pool: PgPool) {
    // Executed through a handle without a cache: Redis knows nothing of the key.
    let plain = testing::setup_with(Idem::new(pool.clone())).await;
    let event = testing::paid("o-warm", 200);
    let Outcome::Executed(id) = pay(&plain, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };

    let (cached, prefix) = redis_support::setup(&pool).await;
    assert_eq!(
        pay(&cached, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    let stats = redis_support::written(&cached, 1).await;
    assert_eq!((stats.misses, stats.hits), (1, 0));
    let url = redis_support::redis_url();
    assert_eq!(redis_support::names_under(&url, &prefix).await.len(), 1);

    pool.close().await;
    assert_eq!(
        pay(&cached, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(redis_support::stats(&cached).hits, 1);
}
