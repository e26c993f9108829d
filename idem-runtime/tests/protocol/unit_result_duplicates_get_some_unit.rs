//! A handler returning `Result<(), E>` stores nothing, and its duplicates still get `Outcome::Duplicate(Some(()))`: the `()` needs no storing. With `store_result = false`, and for a batch handler, duplicates get `Duplicate(None)`.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", scope = "unit_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(drop)
}

#[idempotent(key = "order_id", scope = "unit_pay_unstored", store_result = false)]
async fn pay_unstored(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(drop)
}

#[idempotent(key = "order_id", scope = "unit_pay_all")]
async fn pay_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    for event in events {
        testing::insert_effect(tx, event).await?;
    }
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn unit_result_duplicates_get_some_unit(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-unit", 100);

    assert_eq!(pay(&idem, &event).await.unwrap(), Outcome::Executed(()));
    assert_eq!(
        pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(()))
    );
    let stored: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT result FROM idem.idem_keys WHERE scope = 'unit_pay'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, None, "a `()` result stores nothing");

    assert!(pay_unstored(&idem, &event).await.unwrap().is_executed());
    assert_eq!(
        pay_unstored(&idem, &event).await.unwrap(),
        Outcome::Duplicate(None)
    );

    let events = [event];
    assert!(
        pay_all(&idem, &events).await[0]
            .as_ref()
            .unwrap()
            .is_executed()
    );
    assert_eq!(
        pay_all(&idem, &events).await.remove(0).unwrap(),
        Outcome::Duplicate(None)
    );
}
