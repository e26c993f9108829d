//! A Redis that stops answering (frozen with SIGSTOP) delays no delivery beyond the cache timeout: deliveries go through PostgreSQL, and the cache recovers when Redis answers again.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent};
use redis_support::PrivateRedis;
use sqlx::{PgConnection, PgPool};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = "order_id", scope = "stalled_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn stalled_redis_does_not_block_deliveries(pool: PgPool) {
    let server = PrivateRedis::start().await;
    let timeout = Duration::from_millis(100);
    let cache = redis_support::cache_at(&server.url(), &redis_support::unique_prefix())
        .timeout(timeout)
        .retry_after(Duration::from_millis(200));
    let idem = redis_support::setup_with(&pool, cache).await;
    let cached = testing::paid("o-stalled-cached", 100);
    let Outcome::Executed(id) = pay(&idem, &cached).await.unwrap() else {
        panic!("the first delivery executes");
    };
    assert_eq!(
        pay(&idem, &cached).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );

    server.pause();
    let mut slowest = Duration::ZERO;
    let mut new_ids = Vec::new();
    for n in 0..10 {
        let started = Instant::now();
        assert_eq!(
            pay(&idem, &cached).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
        let event = testing::paid(&format!("o-stalled-{n}"), 100);
        let Outcome::Executed(new_id) = pay(&idem, &event).await.unwrap() else {
            panic!("a new key executes");
        };
        new_ids.push(new_id);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without the timeout, the first delivery would wait for as long as Redis is frozen.
    assert!(
        slowest < Duration::from_secs(2),
        "slowest pair of deliveries: {slowest:?}"
    );
    let stalled = redis_support::stats(&idem);
    assert!(stalled.errors + stalled.write_errors >= 1, "{stalled:?}");
    assert!(stalled.skipped >= 1, "{stalled:?}");

    server.resume();
    redis_support::eventually(Duration::from_secs(10), "the cache answers again", || {
        let (idem, cached) = (idem.clone(), cached.clone());
        async move {
            let hits = redis_support::stats(&idem).hits;
            assert_eq!(
                pay(&idem, &cached).await.unwrap(),
                Outcome::Duplicate(Some(id))
            );
            redis_support::stats(&idem).hits > hits
        }
    })
    .await;
    assert_eq!(RUNS.load(Ordering::SeqCst), 11, "no body ran twice");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 11);
}
