//! A duplicate of a committed key is answered from Redis: PostgreSQL is not queried (its pool is closed) and the body does not run again.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicU32, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Error, Outcome, idempotent, key::KeyBuilder};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
    note: String,
}

#[idempotent(key = "order_id", fingerprint = "amount_cents", scope = "cached_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let payment_id = testing::insert_effect(tx, event).await?;
    Ok(Receipt {
        payment_id,
        note: format!("paid {} cents", event.amount_cents),
    })
}

#[sqlx::test(migrations = false)]
async fn duplicate_after_commit_is_answered_from_redis(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let event = testing::paid("o-cached", 700);

    let Outcome::Executed(receipt) = pay(&idem, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    let stats = redis_support::written(&idem, 1).await;
    assert_eq!((stats.misses, stats.hits), (1, 0));

    // The entry: `<prefix><scope>:<key>`, with the default TTL of 10 minutes.
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let name = redis_support::entry_name(&idem, &prefix, "cached_pay", key).await;
    let ttl = redis_support::pttl(&redis_support::redis_url(), &name).await;
    assert!((590_000..=600_000).contains(&ttl), "ttl {ttl} ms");

    // From here on, any query to PostgreSQL fails.
    pool.close().await;
    for _ in 0..3 {
        assert_eq!(
            pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(receipt.clone()))
        );
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(redis_support::stats(&idem).hits, 3);

    // The closed pool is real: a key that Redis does not know goes to PostgreSQL and fails.
    let unknown = testing::paid("o-not-cached", 700);
    assert!(matches!(
        pay(&idem, &unknown).await,
        Err(Error::Database(_))
    ));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
