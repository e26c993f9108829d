//! With Redis stopped mid-run, every delivery is still processed correctly through PostgreSQL, without errors; when Redis returns, the cache recovers by itself.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Idem, idempotent};
use redis_support::PrivateRedis;
use sqlx::{PgConnection, PgPool};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = "order_id", scope = "outage_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, event).await
}

fn event(n: usize) -> OrderEvent {
    testing::paid(&format!("o-outage-{n}"), 100)
}

/// Delivers `event(n)` and checks that it executes or is a duplicate, as `executes` says,
/// within a bound that a blocked cache call would exceed.
async fn deliver(idem: &Idem, n: usize, executes: bool) -> Option<i64> {
    let started = Instant::now();
    let outcome = pay(idem, &event(n)).await.expect("no delivery fails");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "delivery {n} took {:?}",
        started.elapsed()
    );
    assert_eq!(
        outcome.is_executed(),
        executes,
        "delivery of {n}: {outcome:?}"
    );
    outcome.into_value()
}

#[sqlx::test(migrations = false)]
async fn outage_falls_back_to_postgres_and_recovers(pool: PgPool) {
    let mut server = PrivateRedis::start().await;
    let cache = redis_support::cache_at(&server.url(), &redis_support::unique_prefix())
        .timeout(Duration::from_millis(200))
        .retry_after(Duration::from_millis(100));
    let idem = redis_support::setup_with(&pool, cache).await;

    // Redis up: new keys execute and are cached; their duplicates are answered from Redis.
    for n in 0..5 {
        deliver(&idem, n, true).await;
    }
    redis_support::written(&idem, 5).await;
    for n in 0..5 {
        deliver(&idem, n, false).await;
    }
    assert_eq!(redis_support::stats(&idem).hits, 5);

    // Redis gone: duplicates and new keys alike go through PostgreSQL.
    server.stop();
    for round in 0..3 {
        for n in 0..5 {
            deliver(&idem, n, false).await;
        }
        for n in 5 + round * 5..10 + round * 5 {
            deliver(&idem, n, true).await;
        }
    }
    let down = redis_support::stats(&idem);
    assert_eq!(down.hits, 5, "nothing answered from a stopped Redis");
    assert!(
        down.errors + down.write_errors >= 1,
        "the failure is counted: {down:?}"
    );
    assert!(down.skipped >= 1, "later deliveries skip Redis: {down:?}");
    assert_eq!(RUNS.load(Ordering::SeqCst), 20);

    // Redis back, empty: PostgreSQL's duplicates fill it again, then Redis answers.
    server.restart().await;
    redis_support::eventually(Duration::from_secs(10), "the cache answers again", || {
        let idem = idem.clone();
        async move {
            let hits = redis_support::stats(&idem).hits;
            deliver(&idem, 3, false).await;
            redis_support::stats(&idem).hits > hits
        }
    })
    .await;
    for n in 0..20 {
        deliver(&idem, n, false).await;
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 20, "no body ran twice");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 20);
}
