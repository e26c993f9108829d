//! A body that swallows a database error and returns `Ok` from its aborted transaction is not reported as executed: nothing was committed.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Outcome, idempotent, key::KeyBuilder};
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
        // Nothing committed; the failure counts as an attempt, so that a body that always
        // swallows an error is parked after max_attempts.
        let record = idem
            .record(scope, key)
            .await
            .unwrap()
            .expect("the failure is recorded");
        assert_eq!(
            (record.status, record.attempts),
            (Status::Failed, 1),
            "{scope}"
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

struct Line {
    order_id: String,
    swallow: bool,
}

#[idempotent(
    key = "order_id",
    scope = "batched",
    batch = true,
    store_result = false
)]
async fn apply_line(tx: &mut PgConnection, line: &Line) -> Result<i64, sqlx::Error> {
    apply_ignoring_errors(tx, &testing::paid(&line.order_id, 1), line.swallow).await
}

#[sqlx::test(migrations = false)]
async fn ok_from_an_aborted_batch_transaction_is_not_an_execution(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // The last body of the batch swallows the error: no later statement notices.
    let batch = [("o-line-1", false), ("o-line-2", true)].map(|(order_id, swallow)| Line {
        order_id: order_id.into(),
        swallow,
    });

    let outcomes = apply_line_batch(&idem, &batch).await;
    assert!(
        outcomes[0].as_ref().is_ok_and(Outcome::is_executed),
        "{:?}",
        outcomes[0]
    );
    let error = outcomes[1]
        .as_ref()
        .expect_err("the swallowing body must not execute");
    assert!(
        matches!(error, Error::Database(source) if source.as_database_error().and_then(|db| db.code()).as_deref() == Some("25P02")),
        "{error:?}"
    );

    // Only the healthy line is committed, with its key; the swallowing one's failure is
    // recorded as an attempt.
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 2);
    let committed = KeyBuilder::new()
        .part("order_id", "o-line-1")
        .unwrap()
        .finish();
    assert!(idem.record("batched", committed).await.unwrap().is_some());
}
