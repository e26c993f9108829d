//! A failing handler leaves no business effect, records `failed` with the error text and the attempts, and a later delivery succeeds.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Outcome, idempotent, key::KeyBuilder};
use sqlx::PgConnection;
use sqlx::PgPool;

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("card declined for order {0}")]
    Declined(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

struct Delivery {
    event: OrderEvent,
    decline: bool,
}

#[idempotent(key = "event.order_id", scope = "charge")]
async fn charge(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, PaymentError> {
    // The effect is written first: a failure after it must roll it back.
    let id = testing::insert_effect(tx, &delivery.event).await?;
    if delivery.decline {
        return Err(PaymentError::Declined(delivery.event.order_id.clone()));
    }
    Ok(id)
}

#[sqlx::test(migrations = false)]
async fn failed_handler_rolls_back_records_the_failure_and_a_later_delivery_succeeds(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-fail", 700);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();

    for attempt in 1..=2 {
        let failing = Delivery {
            event: event.clone(),
            decline: true,
        };
        let error = charge(&idem, &failing).await.unwrap_err();
        let Error::Handler {
            source,
            attempts,
            parked,
        } = &error
        else {
            panic!("expected a handler error, got {error:?}");
        };
        assert!(matches!(source, PaymentError::Declined(order) if order == "o-fail"));
        assert_eq!((*attempts, *parked), (attempt, false));
        assert_eq!(error.disposition(), Disposition::Retry);

        assert_eq!(
            testing::count_rows(&pool, "order_effects").await,
            0,
            "the effect survived the failure"
        );
        let record = idem
            .record("charge", key)
            .await
            .unwrap()
            .expect("the failure is recorded");
        assert_eq!(record.status, Status::Failed);
        assert_eq!(record.attempts, attempt);
        assert_eq!(
            record.last_error.as_deref(),
            Some("card declined for order o-fail")
        );
        assert_eq!(record.result, None);
    }

    let healthy = Delivery {
        event: event.clone(),
        decline: false,
    };
    let Outcome::Executed(id) = charge(&idem, &healthy).await.unwrap() else {
        panic!("the retry of a failed key must run the body");
    };
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
    let record = idem.record("charge", key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Success);
    assert_eq!(
        record.attempts, 3,
        "two failed executions and the successful one"
    );
    assert_eq!(record.result, Some(serde_json::json!(id)));

    // Once succeeded, the key is final: a failing delivery of it is a duplicate.
    let late = Delivery {
        event,
        decline: true,
    };
    assert_eq!(
        charge(&idem, &late).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
