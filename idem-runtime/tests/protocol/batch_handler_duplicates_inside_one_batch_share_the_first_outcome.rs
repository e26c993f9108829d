//! Messages with the same key inside one batch reach a batch handler's body once; the later ones share the first one's outcome, also when it failed.
use crate::support::batch as batch_handler_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::{Calls, all_ok, effects, ids, insert_all, paid_batch};
use idem_runtime::{Error, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("negative amount for order {0}")]
    Negative(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[idempotent(key = "order_id, event_type")]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
) -> Result<(), RecordError> {
    calls.record(events);
    insert_all(tx, events).await?;
    match events.iter().find(|event| event.amount_cents < 0) {
        Some(event) => Err(RecordError::Negative(event.order_id.clone())),
        None => Ok(()),
    }
}

#[sqlx::test(migrations = false)]
async fn duplicates_inside_one_batch_reach_the_body_once(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let events = paid_batch(&[("a", 1), ("b", 2), ("a", 1), ("c", 3), ("b", 2), ("b", 2)]);

    let outcomes = all_ok(record_orders(&idem, &events, &calls).await);
    assert_eq!(
        outcomes,
        vec![
            Outcome::Executed(()),
            Outcome::Executed(()),
            Outcome::Duplicate(None),
            Outcome::Executed(()),
            Outcome::Duplicate(None),
            Outcome::Duplicate(None),
        ]
    );
    assert_eq!(calls.all(), vec![ids(&["a", "b", "c"])]);
    assert_eq!(
        effects(&pool).await,
        vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
    );
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 3);
}

#[sqlx::test(migrations = false)]
async fn duplicate_of_a_failing_message_in_the_batch_is_told_to_retry(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let events = paid_batch(&[("ok", 1), ("bad", -1), ("bad", -1)]);

    let mut outcomes = record_orders(&idem, &events, &calls).await.into_iter();
    assert_eq!(outcomes.next().unwrap().unwrap(), Outcome::Executed(()));
    let failed = outcomes.next().unwrap().unwrap_err();
    assert!(
        matches!(&failed, Error::Handler { source: RecordError::Negative(order), attempts: 1, parked: false } if order == "bad"),
        "{failed:?}"
    );
    let duplicate = outcomes.next().unwrap().unwrap_err();
    assert!(
        matches!(duplicate, Error::InProgress { .. }),
        "{duplicate:?}"
    );
    // The batch once, then each claimed message alone; the duplicate never.
    assert_eq!(
        calls.all(),
        vec![ids(&["ok", "bad"]), ids(&["ok"]), ids(&["bad"])]
    );
    assert_eq!(effects(&pool).await, vec![("ok".into(), 1)]);
}
