//! An `Option` key field that is `None` is a key error: nothing is claimed or written, so absent values never merge messages into one key.
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Disposition, Error, KeyError, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

static RUNS: AtomicUsize = AtomicUsize::new(0);

struct Customer {
    id: Option<i64>,
}

struct Signup {
    customer: Customer,
    region: String,
}

#[idempotent(key = "event_key")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "region, customer.id")]
async fn welcome(tx: &mut PgConnection, signup: &Signup) -> Result<(), sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    sqlx::query(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, 'welcome', 0)",
    )
    .bind(&signup.region)
    .execute(tx)
    .await
    .map(drop)
}

#[sqlx::test(migrations = false)]
async fn none_key_field_is_a_key_error_and_writes_nothing(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let unkeyed = testing::paid("o-unkeyed", 100);
    assert_eq!(unkeyed.event_key, None);

    // Two different events without a key: neither is applied, neither is a duplicate of the other.
    for order_id in ["o-unkeyed", "o-other"] {
        let event = OrderEvent {
            order_id: order_id.into(),
            ..unkeyed.clone()
        };
        let error = apply(&idem, &event).await.unwrap_err();
        assert!(
            matches!(
                error,
                Error::Key(KeyError::MissingValue { field: "event_key" })
            ),
            "{error:?}"
        );
        assert_eq!(error.disposition(), Disposition::DeadLetter);
    }

    let nested = Signup {
        customer: Customer { id: None },
        region: "eu".into(),
    };
    let error = welcome(&idem, &nested).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Key(KeyError::MissingValue {
                field: "customer.id"
            })
        ),
        "{error:?}"
    );

    assert_eq!(RUNS.load(Ordering::SeqCst), 0, "a body ran without a key");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 0);

    // With a value the same handlers run.
    let keyed = OrderEvent {
        event_key: Some(Uuid::new_v4()),
        ..unkeyed
    };
    assert!(matches!(
        apply(&idem, &keyed).await.unwrap(),
        Outcome::Executed(_)
    ));
    let present = Signup {
        customer: Customer { id: Some(7) },
        ..nested
    };
    assert_eq!(
        welcome(&idem, &present).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 2);
}
