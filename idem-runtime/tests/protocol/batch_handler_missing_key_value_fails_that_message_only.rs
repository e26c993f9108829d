//! In a batch handler's batch, a message whose `Option` key field is `None` gets `Error::Key` and never reaches the body; the other messages are processed.
use crate::support::batch as batch_handler_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::{Calls, effects, insert_all};
use idem_runtime::{Disposition, Error, KeyError, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[idempotent(key = "event_key")]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    insert_all(tx, events).await
}

fn keyed(order: &str, key: Option<Uuid>) -> OrderEvent {
    OrderEvent {
        event_key: key,
        ..testing::paid(order, 1)
    }
}

#[sqlx::test(migrations = false)]
async fn none_key_field_fails_that_message_only(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let events = vec![
        keyed("k1", Some(Uuid::new_v4())),
        keyed("unkeyed", None),
        keyed("k2", Some(Uuid::new_v4())),
        keyed("also-unkeyed", None),
    ];

    let mut outcomes = record_orders(&idem, &events, &calls).await.into_iter();
    assert_eq!(outcomes.next().unwrap().unwrap(), Outcome::Executed(()));
    for expected_executed in [false, true, false] {
        let outcome = outcomes.next().unwrap();
        if expected_executed {
            assert_eq!(outcome.unwrap(), Outcome::Executed(()));
        } else {
            let error = outcome.unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::Key(KeyError::MissingValue { field: "event_key" })
                ),
                "{error:?}"
            );
            assert_eq!(error.disposition(), Disposition::DeadLetter);
        }
    }
    assert_eq!(
        calls.all(),
        vec![vec!["k1".to_owned(), "k2".to_owned()]],
        "a message without a key reached the body"
    );
    assert_eq!(
        effects(&pool).await,
        vec![("k1".into(), 1), ("k2".into(), 1)]
    );
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 2);
}
