//! Handles on two databases, or on two schemas of one database, that share one Redis with
//! the default settings never answer each other's keys: each runs its own body once.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::cache::RedisCache;
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "tenant_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

/// A handle with the cache's default prefix on the shared Redis.
async fn handle(pool: &PgPool, schema: &str) -> Idem {
    let cache = RedisCache::from_url(&redis_support::redis_url()).expect("a valid Redis URL");
    let idem = Idem::builder(pool.clone())
        .schema(schema)
        .redis(cache)
        .build()
        .expect("valid settings");
    testing::setup_with(idem).await
}

async fn deliver_twice_and_count(idem: &Idem, event: &OrderEvent) {
    assert!(pay(idem, event).await.unwrap().is_executed());
    redis_support::eventually(
        std::time::Duration::from_secs(5),
        "the cache write",
        || async { redis_support::stats(idem).writes >= 1 },
    )
    .await;
    assert!(matches!(
        pay(idem, event).await.unwrap(),
        Outcome::Duplicate(Some(_))
    ));
    assert_eq!(
        redis_support::stats(idem).hits,
        1,
        "the duplicate came from Redis"
    );
}

#[sqlx::test(migrations = false)]
async fn two_databases_with_the_same_scope_and_key_each_run_their_body(pool: PgPool) {
    // A second database on the same server: a tenant, or staging beside production.
    let name = format!("idem_second_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&pool)
        .await
        .unwrap();
    let options = pool.connect_options().as_ref().clone().database(&name);
    let second_pool = PgPool::connect_with(options).await.unwrap();

    let event = testing::paid("o-tenant", 700);
    let first = handle(&pool, "idem").await;
    let second = handle(&second_pool, "idem").await;
    deliver_twice_and_count(&first, &event).await;
    deliver_twice_and_count(&second, &event).await;
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
    assert_eq!(testing::count_rows(&second_pool, "order_effects").await, 1);

    second_pool.close().await;
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&pool)
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn two_schemas_with_the_same_scope_and_key_each_run_their_body(pool: PgPool) {
    let event = testing::paid("o-schema", 700);
    let first = handle(&pool, "idem").await;
    deliver_twice_and_count(&first, &event).await;
    let second = handle(&pool, "idem_staging").await;
    let Outcome::Executed(_) = pay(&second, &event).await.unwrap() else {
        panic!("the other schema has its own keys: the body runs");
    };
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 2);
}
