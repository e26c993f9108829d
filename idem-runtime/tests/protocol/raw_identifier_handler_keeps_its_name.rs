//! A handler named with a raw identifier (`r#type`) gets `type_batch`, and its default scope is its module path and name without the `r#`.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id", batch = true)]
async fn r#type(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn raw_identifier_handler_has_a_batch_variant_and_a_readable_scope(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let events = [testing::paid("o-raw-1", 10), testing::paid("o-raw-2", 20)];

    assert!(r#type(&idem, &events[0]).await.unwrap().is_executed());
    let outcomes = type_batch(&idem, &events).await;
    assert!(matches!(outcomes[0], Ok(Outcome::Duplicate(Some(_)))));
    assert!(matches!(outcomes[1], Ok(Outcome::Executed(_))));

    for event in &events {
        let key = KeyBuilder::new()
            .part("order_id", &event.order_id)
            .unwrap()
            .finish();
        let record = idem
            .record(concat!(module_path!(), "::type"), key)
            .await
            .unwrap();
        assert!(
            record.is_some(),
            "{}: no record in the default scope",
            event.order_id
        );
    }
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 2);
}
