//! A body that swallows a database error and returns `Ok` from its aborted transaction is not reported as executed: nothing was committed.
use idem_runtime::{Disposition, Error, Outcome, idempotent, key::KeyBuilder};
use idem_suite::orders::OrderEvent;
use idem_suite::testing;
use sqlx::{PgConnection, PgPool};

/// Applies the event; on a "harmless" error (here a unique violation of a second write)
/// the handler carries on, which PostgreSQL does not: the transaction is aborted.
async fn apply_ignoring_errors(
    tx: &mut PgConnection,
    event: &OrderEvent,
    swallow: bool,
) -> Result<i64, sqlx::Error> {
    let id = testing::insert_effect(tx, event).await?;
    if swallow {
        let duplicate = sqlx::query("INSERT INTO order_effects (id, order_id, event_type, amount_cents) VALUES ($1, 'x', 'x', 0)")
            .bind(id)
            .execute(&mut *tx)
            .await;
        assert!(duplicate.is_err(), "the second write must fail");
    }
    Ok(id)
}

struct Delivery {
    event: OrderEvent,
    swallow: bool,
}

#[idempotent(key = "event.order_id", scope = "stored")]
async fn with_result(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, sqlx::Error> {
    apply_ignoring_errors(tx, &delivery.event, delivery.swallow).await
}

#[idempotent(key = "event.order_id", scope = "unstored", store_result = false)]
async fn without_result(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, sqlx::Error> {
    apply_ignoring_errors(tx, &delivery.event, delivery.swallow).await
}

#[idempotent(key = "event.order_id", scope = "unit")]
async fn unit_result(tx: &mut PgConnection, delivery: &Delivery) -> Result<(), sqlx::Error> {
    apply_ignoring_errors(tx, &delivery.event, delivery.swallow)
        .await
        .map(drop)
}

#[sqlx::test(migrations = false)]
async fn ok_from_an_aborted_transaction_is_an_error_not_an_execution(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-swallowed", 75);
    let (swallowing, healthy) = (
        Delivery {
            event: event.clone(),
            swallow: true,
        },
        Delivery {
            event: event.clone(),
            swallow: false,
        },
    );

    let outcomes = [
        ("stored", with_result(&idem, &swallowing).await.map(drop)),
        (
            "unstored",
            without_result(&idem, &swallowing).await.map(drop),
        ),
        ("unit", unit_result(&idem, &swallowing).await.map(drop)),
    ];
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    for (scope, outcome) in outcomes {
        let error = outcome.expect_err(scope);
        let Error::Database(source) = &error else {
            panic!("{scope}: expected a database error, got {error:?}");
        };
        // 25P02: current transaction is aborted.
        assert_eq!(
            source
                .as_database_error()
                .and_then(|db| db.code())
                .as_deref(),
            Some("25P02"),
            "{scope}"
        );
        assert_eq!(error.disposition(), Disposition::Retry);
        assert_eq!(
            idem.record(scope, key).await.unwrap(),
            None,
            "{scope}: a key was recorded"
        );
    }
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);

    // Nothing was claimed: a correct delivery executes.
    assert!(with_result(&idem, &healthy).await.unwrap().is_executed());
    assert!(without_result(&idem, &healthy).await.unwrap().is_executed());
    assert_eq!(
        unit_result(&idem, &healthy).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 3);
}
