//! Once a cached key expires, its duplicate is answered by PostgreSQL, still without running the body, and the key is cached again.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = "order_id", scope = "expiring_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn expired_entries_leave_the_answer_to_postgres(pool: PgPool) {
    let url = redis_support::redis_url();
    let prefix = redis_support::unique_prefix();
    let cache = redis_support::cache_at(&url, &prefix).ttl(Duration::from_millis(300));
    let idem = redis_support::setup_with(&pool, cache).await;
    let event = testing::paid("o-expiring", 100);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let name = redis_support::entry_name(&idem, &prefix, "expiring_pay", key).await;

    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    redis_support::written(&idem, 1).await;
    let ttl = redis_support::pttl(&url, &name).await;
    assert!((1..=300).contains(&ttl), "ttl {ttl} ms");

    redis_support::eventually(Duration::from_secs(5), "the entry expires", || {
        let (url, name) = (url.clone(), name.clone());
        async move { redis_support::entry(&url, &name).await.is_none() }
    })
    .await;

    let before = redis_support::stats(&idem);
    assert_eq!(
        pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    let after = redis_support::written(&idem, before.writes + 1).await;
    assert_eq!(after.hits, before.hits, "not answered from Redis");
    assert_eq!(after.misses, before.misses + 1);
    assert!(redis_support::entry(&url, &name).await.is_some());
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
