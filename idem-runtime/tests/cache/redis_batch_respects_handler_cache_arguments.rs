//! `batch = true` keeps the handler's `cache = false` and `cache_ttl`: when a failing message sends a batch back one message at a time, the messages that succeed are cached (or not) as the handler says, not with the handle's defaults.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("declined")]
    Declined,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Declines the order `o-declined`: its batch rolls back and goes one message at a time.
async fn pay_or_decline(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, PayError> {
    if event.order_id == "o-declined" {
        return Err(PayError::Declined);
    }
    Ok(testing::insert_effect(tx, event).await?)
}

#[idempotent(
    key = "order_id",
    scope = "batch_uncached_pay",
    cache = false,
    batch = true
)]
async fn uncached_pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, PayError> {
    pay_or_decline(tx, event).await
}

#[idempotent(
    key = "order_id",
    scope = "batch_short_lived_pay",
    cache_ttl = "90s",
    batch = true
)]
async fn short_lived_pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, PayError> {
    pay_or_decline(tx, event).await
}

fn batch() -> Vec<OrderEvent> {
    ["o-first", "o-declined", "o-last"]
        .into_iter()
        .map(|order| testing::paid(order, 100))
        .collect()
}

fn key(order_id: &str) -> idem_runtime::IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

#[sqlx::test(migrations = false)]
async fn batch_with_cache_false_leaves_redis_alone(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let url = redis_support::redis_url();
    let events = batch();

    let outcomes = uncached_pay_batch(&idem, &events).await;
    assert!(outcomes[0].as_ref().is_ok_and(Outcome::is_executed));
    assert!(outcomes[1].is_err(), "{:?}", outcomes[1]);
    assert!(outcomes[2].as_ref().is_ok_and(Outcome::is_executed));
    // The duplicates of the committed messages, one by one and as a batch.
    assert!(
        uncached_pay(&idem, &events[0])
            .await
            .unwrap()
            .is_duplicate()
    );
    let again = uncached_pay_batch(&idem, &events[2..]).await;
    assert!(again[0].as_ref().is_ok_and(Outcome::is_duplicate));

    // Nothing was written to Redis, nor asked of it.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(redis_support::stats(&idem), Default::default());
    assert!(redis_support::names_under(&url, &prefix).await.is_empty());
}

#[sqlx::test(migrations = false)]
async fn batch_with_cache_ttl_keeps_its_entries_that_long(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let url = redis_support::redis_url();
    let events = batch();

    let outcomes = short_lived_pay_batch(&idem, &events).await;
    assert!(outcomes[0].as_ref().is_ok_and(Outcome::is_executed));
    assert!(outcomes[1].is_err(), "{:?}", outcomes[1]);
    assert!(outcomes[2].as_ref().is_ok_and(Outcome::is_executed));
    // The two messages committed one by one after the rollback are cached, with the
    // handler's TTL rather than the handle's 10 minutes.
    redis_support::written(&idem, 2).await;
    for order in ["o-first", "o-last"] {
        let name =
            redis_support::entry_name(&idem, &prefix, "batch_short_lived_pay", key(order)).await;
        let ttl = redis_support::pttl(&url, &name).await;
        assert!(
            (80_000..=90_000).contains(&ttl),
            "{order}: cache_ttl = \"90s\", got {ttl} ms"
        );
    }
    assert_eq!(redis_support::names_under(&url, &prefix).await.len(), 2);
}
