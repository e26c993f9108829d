//! When a batch handler's body fails, the batch rolls back and its messages go one by one: the failing message records its failure (and is parked after `max_attempts`), the others commit exactly once, and a later delivery of the failed one succeeds.
use crate::support::batch as batch_handler_support;

use std::collections::HashSet;
use std::sync::Mutex;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::{Calls, effects, ids, insert_all};
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("order {0} is declined")]
    Declined(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The orders that the body currently refuses.
#[derive(Default)]
struct Declined(Mutex<HashSet<String>>);

impl Declined {
    fn set(&self, order: &str, declined: bool) {
        let mut set = self.0.lock().unwrap();
        if declined {
            set.insert(order.to_owned());
        } else {
            set.remove(order);
        }
    }

    fn first_of(&self, events: &[&OrderEvent]) -> Option<String> {
        let set = self.0.lock().unwrap();
        events
            .iter()
            .find(|event| set.contains(&event.order_id))
            .map(|event| event.order_id.clone())
    }
}

#[idempotent(
    key = "order_id, event_type",
    scope = "record_orders",
    max_attempts = 2
)]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
    declined: &Declined,
) -> Result<(), RecordError> {
    calls.record(events);
    // The rows are written first: a failure after them must roll them back.
    insert_all(tx, events).await?;
    match declined.first_of(events) {
        Some(order) => Err(RecordError::Declined(order)),
        None => Ok(()),
    }
}

fn events(orders: &[&str]) -> Vec<OrderEvent> {
    orders
        .iter()
        .map(|&order| testing::paid(order, 100))
        .collect()
}

fn key(order: &str) -> idem_runtime::IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order)
        .unwrap()
        .part("event_type", &crate::support::orders::EventType::Paid)
        .unwrap()
        .finish()
}

fn applied(effects: Vec<(String, i64)>) -> Vec<String> {
    let mut orders: Vec<String> = effects.into_iter().map(|(order, _)| order).collect();
    orders.sort();
    orders
}

#[sqlx::test(migrations = false)]
async fn failing_message_records_its_failure_the_others_commit_once_and_a_retry_succeeds(
    pool: PgPool,
) {
    let idem = testing::setup(&pool).await;
    let (calls, declined) = (Calls::default(), Declined::default());
    declined.set("b", true);

    let outcomes = record_orders(&idem, &events(&["a", "b", "c"]), &calls, &declined).await;
    let outcomes: Vec<_> = outcomes.into_iter().collect();
    assert_eq!(outcomes[0].as_ref().unwrap(), &Outcome::Executed(()));
    assert_eq!(outcomes[2].as_ref().unwrap(), &Outcome::Executed(()));
    let failure = outcomes[1].as_ref().unwrap_err();
    assert!(
        matches!(failure, Error::Handler { source: RecordError::Declined(order), attempts: 1, parked: false } if order == "b"),
        "{failure:?}"
    );
    assert_eq!(failure.disposition(), Disposition::Retry);
    assert_eq!(
        calls.all(),
        vec![ids(&["a", "b", "c"]), ids(&["a"]), ids(&["b"]), ids(&["c"])],
        "the batch once, then each claimed message alone"
    );
    assert_eq!(applied(effects(&pool).await), ids(&["a", "c"]));
    let record = idem
        .record("record_orders", key("b"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.last_error.as_deref(), Some("order b is declined"));
    for order in ["a", "c"] {
        let record = idem
            .record("record_orders", key(order))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((record.status, record.attempts), (Status::Success, 1));
    }

    // Redelivered once the order is accepted: only the failed message reaches the body.
    declined.set("b", false);
    let outcomes = record_orders(&idem, &events(&["a", "b", "c"]), &calls, &declined).await;
    let outcomes: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Duplicate(None),
            Outcome::Executed(()),
            Outcome::Duplicate(None),
        ]
    );
    assert_eq!(calls.all().last(), Some(&ids(&["b"])));
    assert_eq!(calls.count(), 5);
    assert_eq!(applied(effects(&pool).await), ids(&["a", "b", "c"]));
    let record = idem
        .record("record_orders", key("b"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 2));
}

#[sqlx::test(migrations = false)]
async fn message_failing_max_attempts_times_is_parked_and_no_longer_reaches_the_body(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let (calls, declined) = (Calls::default(), Declined::default());
    declined.set("x", true);

    let first = record_orders(&idem, &events(&["x", "y"]), &calls, &declined).await;
    assert!(matches!(
        &first[0],
        Err(Error::Handler {
            attempts: 1,
            parked: false,
            ..
        })
    ));
    assert!(first[1].as_ref().unwrap().is_executed());

    let second = record_orders(&idem, &events(&["x", "y"]), &calls, &declined).await;
    let failure = second[0].as_ref().unwrap_err();
    assert!(
        matches!(
            failure,
            Error::Handler {
                attempts: 2,
                parked: true,
                ..
            }
        ),
        "{failure:?}"
    );
    assert_eq!(failure.disposition(), Disposition::DeadLetter);
    assert!(second[1].as_ref().unwrap().is_duplicate());
    // The failed key alone was retried: the batch held it alone.
    assert_eq!(calls.all()[3..], [ids(&["x"]), ids(&["x"])]);

    // Parked: the body no longer runs for it, even once it would succeed.
    declined.set("x", false);
    let before = calls.count();
    let third = record_orders(&idem, &events(&["x", "z"]), &calls, &declined).await;
    let parked = third[0].as_ref().unwrap_err();
    assert!(
        matches!(parked, Error::Parked { attempts: 2, last_error, .. } if last_error == "order x is declined"),
        "{parked:?}"
    );
    assert!(third[1].as_ref().unwrap().is_executed());
    assert_eq!(calls.all()[before..], [ids(&["z"])]);
    assert_eq!(applied(effects(&pool).await), ids(&["y", "z"]));
}
