//! An entry written straight into Redis by someone without the status table's secret (a
//! key that never ran, marked "succeeded") is a miss: the body runs and its effect is
//! applied, and the forged entry is counted. Rotating the secret invalidates the cache and
//! nothing else.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::key::KeyBuilder;
use idem_runtime::{Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "guarded_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_forged_entry_for_a_key_that_never_ran_does_not_skip_the_body(pool: PgPool) {
    let url = redis_support::redis_url();
    let (idem, prefix) = redis_support::setup(&pool).await;
    let event = testing::paid("o-forged", 900);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let name = redis_support::entry_name(&idem, &prefix, "guarded_pay", key).await;

    // An entry as an attacker with write access to Redis would write it.
    let mut set = idem_runtime::cache::redis::cmd("SET");
    set.arg(&name)
        .arg(format!(r#"{{"v":2,"r":1,"mac":"{}"}}"#, "cd".repeat(32)));
    redis_support::run(&url, &set).await;
    let before = redis_support::stats(&idem).forged;
    let Outcome::Executed(_) = pay(&idem, &event).await.unwrap() else {
        panic!("the body runs despite the forged entry");
    };
    assert_eq!(redis_support::stats(&idem).forged, before + 1);
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM order_effects WHERE order_id = 'o-forged'"
        )
        .fetch_one(&pool)
        .await
        .unwrap(),
        1,
        "the effect is applied"
    );
}

#[sqlx::test(migrations = false)]
async fn a_forged_entry_counts_once_and_the_genuine_entry_then_answers(pool: PgPool) {
    let url = redis_support::redis_url();
    let (idem, prefix) = redis_support::setup(&pool).await;
    let event = testing::paid("o-genuine", 900);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let name = redis_support::entry_name(&idem, &prefix, "guarded_pay", key).await;
    let mut set = idem_runtime::cache::redis::cmd("SET");
    set.arg(&name)
        .arg(format!(r#"{{"v":2,"r":7,"mac":"{}"}}"#, "ef".repeat(32)));
    redis_support::run(&url, &set).await;

    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("the body runs");
    };
    let stats = redis_support::written(&idem, 1).await;
    assert_eq!((stats.forged, stats.hits), (1, 0));
    // The genuine entry replaced the forged one and answers the duplicate.
    assert_eq!(
        pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(redis_support::stats(&idem).hits, 1);
}

#[sqlx::test(migrations = false)]
async fn rotating_the_secret_invalidates_the_cache_and_nothing_else(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let event = testing::paid("o-rotated", 900);
    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("the body runs");
    };
    redis_support::written(&idem, 1).await;
    sqlx::query(
        "UPDATE idem.idem_instance SET cache_secret = uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())",
    )
    .execute(&pool)
    .await
    .unwrap();
    // A handle that reads the new secret: the old entry does not verify, PostgreSQL
    // answers the duplicate, and the body does not run again.
    let rotated = redis_support::setup_with(
        &pool,
        redis_support::cache_at(&redis_support::redis_url(), &prefix),
    )
    .await;
    assert_eq!(
        pay(&rotated, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    let stats = redis_support::stats(&rotated);
    assert_eq!((stats.forged, stats.hits), (1, 0));
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
