//! A batch handler's batch that cannot commit as a whole goes one message at a time: a key held by another delivery beyond the lock timeout gets `InProgress` while the others commit; a serialization failure in the body is retried per message; a body that swallowed a failed statement executes nothing.
use crate::support::batch as batch_handler_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
use batch_handler_support::{Calls, all_ok, effects, ids, insert_all};
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

const LOCK_TIMEOUT: Duration = Duration::from_millis(300);

#[idempotent(key = "order_id, event_type", scope = "orders", shared_scope = true)]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    insert_all(tx, events).await
}

/// One message of the same scope, holding its claim until released.
#[idempotent(key = "order_id, event_type", scope = "orders", shared_scope = true)]
async fn hold_order(
    tx: &mut PgConnection,
    event: &OrderEvent,
    hold: &Checkpoint,
) -> Result<i64, sqlx::Error> {
    let id = testing::insert_effect(tx, event).await?;
    hold.reach().await;
    Ok(id)
}

/// Fails its first run with a serialization failure, as PostgreSQL reports one.
#[idempotent(key = "order_id, event_type", scope = "serialized")]
async fn record_serialized(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
    failed_once: &AtomicBool,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    insert_all(tx, events).await?;
    if !failed_once.swap(true, Ordering::SeqCst) {
        sqlx::query(
            "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$",
        )
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Swallows the error of a failed statement and returns `Ok`.
#[idempotent(key = "order_id, event_type", scope = "swallowing")]
async fn record_swallowing(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    insert_all(tx, events).await?;
    if events.iter().any(|event| event.amount_cents < 0) {
        let _ignored = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
    }
    Ok(())
}

fn events(orders: &[&str]) -> Vec<OrderEvent> {
    orders
        .iter()
        .map(|&order| testing::paid(order, 1))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn key_held_beyond_the_lock_timeout_is_in_progress_and_the_others_commit(pool: PgPool) {
    let idem = testing::setup_with(
        Idem::builder(pool.clone())
            .lock_timeout(LOCK_TIMEOUT)
            .build()
            .unwrap(),
    )
    .await;
    let calls = Calls::default();
    let hold = Checkpoint::new();
    // Held by another process (a handle of its own): the batch meets it at the row lock.
    let other = Idem::builder(pool.clone()).build().unwrap();
    let holder = tokio::spawn({
        let hold = hold.clone();
        async move { hold_order(&other, &testing::paid("held", 1), &hold).await }
    });
    hold.reached().await;

    let outcomes = tokio::time::timeout(
        LOCK_TIMEOUT * 20,
        record_orders(&idem, &events(&["w", "held", "y"]), &calls),
    )
    .await
    .expect("the batch waited for the held key");
    assert_eq!(outcomes[0].as_ref().unwrap(), &Outcome::Executed(()));
    let error = outcomes[1].as_ref().unwrap_err();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(error.disposition(), Disposition::Retry);
    assert_eq!(outcomes[2].as_ref().unwrap(), &Outcome::Executed(()));
    // The claim statement timed out before the body: then each message alone.
    assert_eq!(calls.all(), vec![ids(&["w"]), ids(&["y"])]);

    hold.release();
    assert!(holder.await.unwrap().unwrap().is_executed());
    let outcomes = all_ok(record_orders(&idem, &events(&["w", "held", "y"]), &calls).await);
    assert_eq!(outcomes, vec![Outcome::Duplicate(None); 3]);
    let mut applied: Vec<String> = effects(&pool).await.into_iter().map(|(o, _)| o).collect();
    applied.sort();
    assert_eq!(applied, ids(&["held", "w", "y"]));
}

#[sqlx::test(migrations = false)]
async fn serialization_failure_in_the_body_is_retried_message_by_message(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let failed_once = AtomicBool::new(false);
    let outcomes =
        all_ok(record_serialized(&idem, &events(&["a", "b"]), &calls, &failed_once).await);
    assert_eq!(outcomes, vec![Outcome::Executed(()); 2]);
    assert_eq!(
        calls.all(),
        vec![ids(&["a", "b"]), ids(&["a"]), ids(&["b"])]
    );
    assert_eq!(effects(&pool).await, vec![("a".into(), 1), ("b".into(), 1)]);
}

#[sqlx::test(migrations = false)]
async fn swallowed_statement_error_executes_nothing_of_the_batch(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let mut batch = events(&["a", "bad", "c"]);
    batch[1].amount_cents = -1;
    let outcomes = record_swallowing(&idem, &batch, &calls).await;
    assert_eq!(outcomes[0].as_ref().unwrap(), &Outcome::Executed(()));
    assert!(
        matches!(&outcomes[1], Err(Error::Database(_))),
        "{:?}",
        outcomes[1]
    );
    assert_eq!(outcomes[2].as_ref().unwrap(), &Outcome::Executed(()));
    assert_eq!(
        calls.all(),
        vec![
            ids(&["a", "bad", "c"]),
            ids(&["a"]),
            ids(&["bad"]),
            ids(&["c"])
        ]
    );
    assert_eq!(effects(&pool).await, vec![("a".into(), 1), ("c".into(), 1)]);
}
