//! A duplicate gets the result stored by the execution that succeeded; with `store_result = false` it gets none.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
    note: String,
    applied_at: chrono::DateTime<chrono::Utc>,
}

#[idempotent(key = "order_id", scope = "receipt")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    let payment_id = testing::insert_effect(tx, event).await?;
    // A value that a second execution could not reproduce.
    let applied_at = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *tx)
        .await?;
    Ok(Receipt {
        payment_id,
        note: format!("paid {} cents", event.amount_cents),
        applied_at,
    })
}

#[idempotent(key = "order_id", scope = "no_receipt", store_result = false)]
async fn pay_unstored(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn duplicate_replays_the_stored_result(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-receipt", 900);

    let Outcome::Executed(receipt) = pay(&idem, &event).await.unwrap() else {
        panic!("first delivery must execute");
    };
    for _ in 0..2 {
        assert_eq!(
            pay(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(receipt.clone()))
        );
    }
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);

    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let stored = idem.record("receipt", key).await.unwrap().unwrap().result;
    assert_eq!(stored, Some(serde_json::to_value(&receipt).unwrap()));
}

#[sqlx::test(migrations = false)]
async fn duplicate_gets_no_value_when_results_are_not_stored(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-unstored", 900);

    assert!(matches!(
        pay_unstored(&idem, &event).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert_eq!(
        pay_unstored(&idem, &event).await.unwrap(),
        Outcome::Duplicate(None)
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);

    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    assert_eq!(
        idem.record("no_receipt", key)
            .await
            .unwrap()
            .unwrap()
            .result,
        None
    );
}
