//! A batch handler with a fingerprint rejects, message by message, a key seen before with another payload (in the status table or earlier in the same batch) with `PayloadMismatch`, without giving that message to the body. A message with the payload the key was recorded with is a duplicate, also after a mismatched message of its key in the same batch (as `batch = true`'s).
use crate::support::batch as batch_handler_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::{Calls, all_ok, effects, ids, insert_all, paid_batch};
use idem_runtime::{Disposition, Error, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", fingerprint = "amount_cents")]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    insert_all(tx, events).await
}

#[sqlx::test(migrations = false)]
async fn same_key_with_another_payload_is_rejected_per_message(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    all_ok(record_orders(&idem, &paid_batch(&[("a", 100)]), &calls).await);

    let batch = paid_batch(&[
        ("a", 999),
        ("b", 5),
        ("c", 1),
        ("b", 6),
        ("b", 5),
        ("a", 999),
        // The key's own payload after a mismatch of it: decided on its own.
        ("a", 100),
    ]);
    let outcomes = record_orders(&idem, &batch, &calls).await;
    let mismatch = |outcome: &Result<Outcome<()>, Error<sqlx::Error>>| matches!(outcome, Err(error @ Error::PayloadMismatch { .. }) if error.disposition() == Disposition::DeadLetter);
    // Against the status table.
    assert!(mismatch(&outcomes[0]), "{:?}", outcomes[0]);
    assert_eq!(outcomes[1].as_ref().unwrap(), &Outcome::Executed(()));
    assert_eq!(outcomes[2].as_ref().unwrap(), &Outcome::Executed(()));
    // Against the first message of the batch with the key.
    assert!(mismatch(&outcomes[3]), "{:?}", outcomes[3]);
    assert_eq!(outcomes[4].as_ref().unwrap(), &Outcome::Duplicate(None));
    assert!(mismatch(&outcomes[5]), "{:?}", outcomes[5]);
    assert_eq!(outcomes[6].as_ref().unwrap(), &Outcome::Duplicate(None));
    assert_eq!(outcomes.len(), 7);

    assert_eq!(calls.all(), vec![ids(&["a"]), ids(&["b", "c"])]);
    assert_eq!(
        effects(&pool).await,
        vec![("a".into(), 100), ("b".into(), 5), ("c".into(), 1)]
    );
}

/// One body per message (`batch = true`), with the result stored for replay.
#[idempotent(
    key = "order_id, event_type",
    fingerprint = "amount_cents",
    batch = true
)]
async fn record_order(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    if event.amount_cents == FAILING {
        return Err(sqlx::Error::Protocol("this amount fails".into()));
    }
    insert_all(tx, &[event]).await?;
    Ok(event.amount_cents)
}

/// The amount whose body fails.
const FAILING: i64 = 13;

#[sqlx::test(migrations = false)]
async fn a_re_send_after_a_mismatch_of_its_key_in_the_batch_is_a_duplicate(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let first = record_order_batch(&idem, &paid_batch(&[("a", 100)])).await;
    assert_eq!(first[0].as_ref().unwrap(), &Outcome::Executed(100));

    let batch = paid_batch(&[("a", 999), ("a", 100), ("n", 3), ("n", 4), ("a", 100)]);
    let outcomes = record_order_batch(&idem, &batch).await;
    let mismatch = |outcome: &Result<Outcome<i64>, Error<sqlx::Error>>| {
        matches!(outcome, Err(Error::PayloadMismatch { .. }))
    };
    assert!(mismatch(&outcomes[0]), "{:?}", outcomes[0]);
    // The re-sends of the recorded payload get its stored result, as on their own.
    assert_eq!(
        outcomes[1].as_ref().unwrap(),
        &Outcome::Duplicate(Some(100))
    );
    assert_eq!(outcomes[2].as_ref().unwrap(), &Outcome::Executed(3));
    // A key new in this batch is recorded with its first message's payload.
    assert!(mismatch(&outcomes[3]), "{:?}", outcomes[3]);
    assert_eq!(
        outcomes[4].as_ref().unwrap(),
        &Outcome::Duplicate(Some(100))
    );
    assert_eq!(
        effects(&pool).await,
        vec![("a".into(), 100), ("n".into(), 3)]
    );

    // A first message to be retried keeps its key for itself: the later one with another
    // payload is a mismatch, and does not run before it.
    let outcomes = record_order_batch(&idem, &paid_batch(&[("f", FAILING), ("f", 14)])).await;
    assert!(
        matches!(&outcomes[0], Err(error) if error.disposition() == Disposition::Retry),
        "{:?}",
        outcomes[0]
    );
    assert!(mismatch(&outcomes[1]), "{:?}", outcomes[1]);
    assert_eq!(
        effects(&pool).await,
        vec![("a".into(), 100), ("n".into(), 3)]
    );
}
