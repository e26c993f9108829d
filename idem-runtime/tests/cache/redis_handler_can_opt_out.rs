//! A handler with `cache = false` neither reads nor writes Redis: its duplicates are answered by PostgreSQL, while the other handlers of the same handle use the cache.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "uncached_pay", cache = false)]
async fn uncached_pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id", scope = "explicitly_cached_pay", cache = true)]
async fn cached_pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn handler_with_cache_false_skips_redis(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let url = redis_support::redis_url();
    let event = testing::paid("o-opt-out", 100);

    let Outcome::Executed(id) = uncached_pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    for _ in 0..3 {
        assert_eq!(
            uncached_pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
    }
    assert_eq!(
        redis_support::stats(&idem),
        Default::default(),
        "Redis untouched"
    );
    assert!(redis_support::names_under(&url, &prefix).await.is_empty());

    // `cache = true` is the default: cached.
    let Outcome::Executed(other) = cached_pay(&idem, &event).await.unwrap() else {
        panic!("the other handler's first delivery executes");
    };
    redis_support::written(&idem, 1).await;
    assert_eq!(
        cached_pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(other))
    );
    let stats = redis_support::stats(&idem);
    assert_eq!((stats.writes, stats.hits), (1, 1));
    assert_eq!(redis_support::names_under(&url, &prefix).await.len(), 1);
}
