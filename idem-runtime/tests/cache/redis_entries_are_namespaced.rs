//! Redis entries are named `<prefix><namespace>:<scope>:<key>` and hold idem's JSON entry; handles with different prefixes sharing one Redis do not see each other's entries.

use crate::support::redis as redis_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(key = "order_id", fingerprint = "amount_cents", scope = "named_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    Ok(Receipt {
        payment_id: testing::insert_effect(tx, event).await?,
    })
}

#[sqlx::test(migrations = false)]
async fn entries_are_namespaced_by_prefix(pool: PgPool) {
    let url = redis_support::redis_url();
    let (billing, billing_prefix) = redis_support::setup(&pool).await;
    let shipping_prefix = redis_support::unique_prefix();
    let shipping =
        redis_support::setup_with(&pool, redis_support::cache_at(&url, &shipping_prefix)).await;
    let event = testing::paid("o-named", 4200);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let fingerprint = KeyBuilder::new()
        .part("amount_cents", &event.amount_cents)
        .unwrap()
        .digest();

    let Outcome::Executed(receipt) = pay(&billing, &event).await.unwrap() else {
        panic!("the first delivery executes");
    };
    redis_support::written(&billing, 1).await;
    let name = redis_support::entry_name(&billing, &billing_prefix, "named_pay", key).await;
    assert_eq!(
        redis_support::names_under(&url, &billing_prefix).await,
        vec![name.clone()]
    );
    let entry: serde_json::Value =
        serde_json::from_str(&redis_support::entry(&url, &name).await.unwrap()).unwrap();
    let hex: String = fingerprint
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let mac = entry["mac"].as_str().expect("a signed entry").to_owned();
    assert_eq!(mac.len(), 64, "HMAC-SHA256, hex");
    assert_eq!(
        entry,
        serde_json::json!({"v": 2, "fp": hex, "r": {"payment_id": receipt.payment_id}, "mac": mac})
    );

    // The other prefix has no entry: PostgreSQL answers, then it has its own.
    assert!(
        redis_support::names_under(&url, &shipping_prefix)
            .await
            .is_empty()
    );
    assert_eq!(
        pay(&shipping, &event).await.unwrap(),
        Outcome::Duplicate(Some(receipt.clone()))
    );
    let stats = redis_support::written(&shipping, 1).await;
    assert_eq!((stats.hits, stats.misses, stats.writes), (0, 1, 1));
    assert_eq!(
        redis_support::names_under(&url, &shipping_prefix).await,
        vec![redis_support::entry_name(&shipping, &shipping_prefix, "named_pay", key).await]
    );
}
