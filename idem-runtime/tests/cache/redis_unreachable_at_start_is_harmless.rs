//! A cache whose Redis is unreachable from the start costs nothing but the fallback: deliveries go through PostgreSQL, and the cache starts working once a server listens.

use crate::support::redis as redis_support;

use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent};
use redis_support::PrivateRedis;
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "late_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn unreachable_redis_at_start_is_harmless(pool: PgPool) {
    // Nothing listens on this port yet.
    let mut server = PrivateRedis::unstarted();
    let cache = redis_support::cache_at(&server.url(), &redis_support::unique_prefix())
        .timeout(Duration::from_millis(200))
        .retry_after(Duration::from_millis(100));
    let idem = redis_support::setup_with(&pool, cache).await;
    let event = testing::paid("o-late", 100);

    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    for _ in 0..3 {
        assert_eq!(
            pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
    }
    let stats = redis_support::stats(&idem);
    assert_eq!((stats.hits, stats.writes), (0, 0));
    assert!(stats.errors >= 1, "{stats:?}");

    server.restart().await;
    redis_support::eventually(Duration::from_secs(10), "the cache answers", || {
        let (idem, event) = (idem.clone(), event.clone());
        async move {
            assert_eq!(
                pay(&idem, &event).await.unwrap(),
                Outcome::Duplicate(Some(id))
            );
            redis_support::stats(&idem).hits > 0
        }
    })
    .await;
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
