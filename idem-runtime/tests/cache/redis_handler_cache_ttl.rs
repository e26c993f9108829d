//! `cache_ttl` sets the time to live of one handler's Redis entries, apart from the handle's default.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "short_lived_pay", cache_ttl = "90s")]
async fn short_lived(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id", scope = "default_lived_pay")]
async fn default_lived(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn handler_ttl_overrides_the_handle_ttl(pool: PgPool) {
    let (idem, prefix) = redis_support::setup(&pool).await;
    let url = redis_support::redis_url();
    let event = testing::paid("o-ttl", 100);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();

    assert!(matches!(
        short_lived(&idem, &event).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert!(matches!(
        default_lived(&idem, &event).await.unwrap(),
        Outcome::Executed(_)
    ));
    redis_support::written(&idem, 2).await;

    let short = redis_support::pttl(
        &url,
        &redis_support::entry_name(&idem, &prefix, "short_lived_pay", key).await,
    )
    .await;
    assert!(
        (80_000..=90_000).contains(&short),
        "cache_ttl = \"90s\": {short} ms"
    );
    let default = redis_support::pttl(
        &url,
        &redis_support::entry_name(&idem, &prefix, "default_lived_pay", key).await,
    )
    .await;
    assert!(
        (590_000..=600_000).contains(&default),
        "the handle's 10 minutes: {default} ms"
    );

    assert!(short_lived(&idem, &event).await.unwrap().is_duplicate());
    assert_eq!(redis_support::stats(&idem).hits, 1);
}
