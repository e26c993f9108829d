//! An `Option` field in `fingerprint` that is `None` is compared like any other value: the message runs, its duplicates are duplicates, and a duplicate that has a value there (or loses it) is a payload mismatch. Key fields keep refusing `None`.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Error, KeyError, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[idempotent(
    key = "order_id, event_type",
    fingerprint = "amount_cents, event_key",
    scope = "fingerprinted_pay",
    batch = true
)]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

/// The same field in the key: `None` is refused there.
#[idempotent(key = "event_key", scope = "stamped_pay")]
async fn pay_stamped(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

#[sqlx::test(migrations = false)]
async fn none_in_a_fingerprint_is_compared_like_a_value(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let unstamped = OrderEvent {
        event_key: None,
        ..testing::paid("o-unstamped", 700)
    };

    let Outcome::Executed(id) = pay(&idem, &unstamped).await.unwrap() else {
        panic!("a message whose fingerprinted field is None executes");
    };
    assert_eq!(
        pay(&idem, &unstamped).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );

    // The same key, now with a value where there was none: another payload.
    let stamped = OrderEvent {
        event_key: Some(Uuid::new_v4()),
        ..unstamped.clone()
    };
    let error = pay(&idem, &stamped).await.unwrap_err();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");

    // And the other way round: a value first, then none.
    let first = OrderEvent {
        event_key: Some(Uuid::new_v4()),
        ..testing::paid("o-stamped", 700)
    };
    assert!(pay(&idem, &first).await.unwrap().is_executed());
    let lost = OrderEvent {
        event_key: None,
        ..first.clone()
    };
    let error = pay(&idem, &lost).await.unwrap_err();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 2);
}

#[sqlx::test(migrations = false)]
async fn none_in_a_fingerprint_goes_through_a_batch(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let batch: Vec<OrderEvent> = ["o-b1", "o-b2"]
        .into_iter()
        .map(|order| OrderEvent {
            event_key: None,
            ..testing::paid(order, 100)
        })
        .collect();
    let outcomes = pay_batch(&idem, &batch).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Ok(Outcome::Executed(_)))),
        "{outcomes:?}"
    );
    let again = pay_batch(&idem, &batch).await;
    assert!(
        again
            .iter()
            .all(|outcome| matches!(outcome, Ok(Outcome::Duplicate(Some(_))))),
        "{again:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn none_in_a_key_is_still_refused(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let unstamped = OrderEvent {
        event_key: None,
        ..testing::paid("o-no-key", 100)
    };
    let error = pay_stamped(&idem, &unstamped).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Key(KeyError::MissingValue { field: "event_key" })
        ),
        "{error:?}"
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);
}
