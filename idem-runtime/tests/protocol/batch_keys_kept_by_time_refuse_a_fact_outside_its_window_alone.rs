//! Batches whose keys are kept by their facts' times (`event_time`): a fact older than
//! its scope's window, or too far ahead, gets `Error::OutsideWindow` alone (dead-letter
//! disposition) and never runs, while the rest of the batch runs; a duplicate inside
//! the batch shares the first one's outcome, and a fact applied before (by the handler of
//! one message that shares the scope) is a duplicate. A failing message goes one by
//! one and records its failure in its fact's bucket; a later batch takes it over, or,
//! once the fact is outside the window of the handle delivering it, refuses it.
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use idem_runtime::retention::Retention;
use idem_runtime::{Disposition, Error, Idem, Outcome, WindowEdge, idempotent};
use sqlx::{PgConnection, PgPool};

use crate::support::batch::{Calls, insert_all};
use crate::support::orders::OrderEvent;
use crate::support::testing;

#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("order {0} is declined")]
    Declined(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The orders that the bodies currently refuse.
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

    fn check(&self, events: &[&OrderEvent]) -> Result<(), RecordError> {
        let set = self.0.lock().unwrap();
        match events.iter().find(|event| set.contains(&event.order_id)) {
            Some(event) => Err(RecordError::Declined(event.order_id.clone())),
            None => Ok(()),
        }
    }
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_orders",
    shared_scope = true
)]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
    declined: &Declined,
) -> Result<(), RecordError> {
    calls.record(events);
    insert_all(tx, events).await?;
    declined.check(events)
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_orders",
    shared_scope = true
)]
async fn record_order(
    tx: &mut PgConnection,
    event: &OrderEvent,
    declined: &Declined,
) -> Result<(), RecordError> {
    insert_all(tx, &[event]).await?;
    declined.check(&[event])
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_receipts",
    batch = true
)]
async fn receipt(
    tx: &mut PgConnection,
    event: &OrderEvent,
    declined: &Declined,
) -> Result<String, RecordError> {
    insert_all(tx, &[event]).await?;
    declined.check(&[event])?;
    Ok(format!("receipt-{}", event.order_id))
}

fn at(order_id: &str, age: TimeDelta) -> OrderEvent {
    let mut event = testing::paid(order_id, 100);
    event.occurred_at = Utc::now() - age;
    event
}

async fn effects_of(pool: &PgPool, order_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM order_effects WHERE order_id = $1")
        .bind(order_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The status and attempts of the scope's key that is not `success`, if any.
async fn unfinished(pool: &PgPool, scope: &str) -> Option<(String, i32)> {
    sqlx::query_as("SELECT status, attempts FROM idem.idem_timed_keys WHERE scope = $1 AND status <> 'success'")
        .bind(scope)
        .fetch_optional(pool)
        .await
        .unwrap()
}

fn is_outside(outcome: &Result<Outcome<()>, Error<RecordError>>, side: WindowEdge) -> bool {
    match outcome {
        Err(error @ Error::OutsideWindow { edge, .. }) => {
            assert_eq!(error.disposition(), Disposition::DeadLetter);
            *edge == side
        }
        _ => false,
    }
}

#[sqlx::test(migrations = false)]
async fn a_fact_outside_its_window_is_refused_alone_and_the_batch_goes_on(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let (calls, declined) = (Calls::default(), Declined::default());

    // Applied before by the handler of one message of the same scope.
    let before = at("before", TimeDelta::minutes(5));
    assert!(
        record_order(&idem, &before, &declined)
            .await
            .unwrap()
            .is_executed()
    );

    let fresh = at("fresh", TimeDelta::minutes(1));
    let old = at("old", TimeDelta::days(8));
    let ahead = at("ahead", -TimeDelta::hours(3));
    let other = at("other", TimeDelta::minutes(90));
    let batch = vec![
        fresh.clone(),
        old.clone(),
        before.clone(),
        fresh.clone(),
        ahead.clone(),
        other.clone(),
    ];
    let outcomes = record_orders(&idem, &batch, &calls, &declined).await;
    assert!(
        matches!(outcomes[0], Ok(Outcome::Executed(()))),
        "{outcomes:?}"
    );
    assert!(
        is_outside(&outcomes[1], WindowEdge::Past),
        "{:?}",
        outcomes[1]
    );
    assert!(
        matches!(outcomes[2], Ok(Outcome::Duplicate(None))),
        "{:?}",
        outcomes[2]
    );
    assert!(
        matches!(outcomes[3], Ok(Outcome::Duplicate(None))),
        "{:?}",
        outcomes[3]
    );
    assert!(
        is_outside(&outcomes[4], WindowEdge::Future),
        "{:?}",
        outcomes[4]
    );
    assert!(
        matches!(outcomes[5], Ok(Outcome::Executed(()))),
        "{outcomes:?}"
    );
    assert_eq!(
        calls.all(),
        vec![vec!["fresh".to_owned(), "other".to_owned()]],
        "the body ran once, with the new facts inside the window only"
    );
    for (order, applied) in [
        ("fresh", 1),
        ("other", 1),
        ("before", 1),
        ("old", 0),
        ("ahead", 0),
    ] {
        assert_eq!(effects_of(&pool, order).await, applied, "{order}");
    }
    // Delivered again: duplicates, and the same refusals.
    let again = record_orders(&idem, &batch, &calls, &declined).await;
    assert!(
        again.iter().enumerate().all(|(i, outcome)| match i {
            1 => is_outside(outcome, WindowEdge::Past),
            4 => is_outside(outcome, WindowEdge::Future),
            _ => matches!(outcome, Ok(Outcome::Duplicate(None))),
        }),
        "{again:?}"
    );
    assert_eq!(calls.count(), 1, "nothing new ran");
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idem.idem_timed_keys")
            .fetch_one(&pool)
            .await
            .unwrap(),
        3,
        "no key of a refused fact"
    );
}

#[sqlx::test(migrations = false)]
async fn a_failing_fact_is_recorded_in_its_bucket_and_taken_over_or_refused_later(pool: PgPool) {
    testing::setup(&pool).await;
    let declined = Declined::default();
    let handle = |hours: u64| {
        Idem::builder(pool.clone())
            .retention(Retention::new(Duration::from_secs(hours * 3600)))
            .build()
            .unwrap()
    };
    let (three_hours, two_hours) = (handle(3), handle(2));

    // A batch whose second fact fails: the batch rolls back and goes one by one; the
    // failure is recorded in the fact's bucket, the others commit with their results.
    let batch = vec![
        at("r1", TimeDelta::minutes(2)),
        at("r2", TimeDelta::minutes(150)),
        at("r3", TimeDelta::minutes(3)),
    ];
    declined.set("r2", true);
    let outcomes = receipt_batch(&three_hours, &batch, &declined).await;
    assert!(
        matches!(&outcomes[0], Ok(Outcome::Executed(r)) if r == "receipt-r1"),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[1], Err(Error::Handler { attempts: 1, .. })),
        "{:?}",
        outcomes[1]
    );
    assert!(
        matches!(&outcomes[2], Ok(Outcome::Executed(r)) if r == "receipt-r3"),
        "{outcomes:?}"
    );
    assert_eq!(
        unfinished(&pool, "timed_receipts").await,
        Some(("failed".to_owned(), 1))
    );
    assert_eq!(effects_of(&pool, "r2").await, 0);

    // The handle whose window is 2 hours refuses the failed fact, 150 minutes old: its
    // key is not final, so it may have expired; the others are duplicates.
    declined.set("r2", false);
    let outcomes = receipt_batch(&two_hours, &batch, &declined).await;
    assert!(
        matches!(&outcomes[0], Ok(Outcome::Duplicate(Some(r))) if r == "receipt-r1"),
        "{outcomes:?}"
    );
    assert!(
        matches!(
            outcomes[1],
            Err(Error::OutsideWindow {
                edge: WindowEdge::Past,
                ..
            })
        ),
        "{:?}",
        outcomes[1]
    );
    assert_eq!(effects_of(&pool, "r2").await, 0, "never run");

    // The 3-hour handle takes the failed key over in the batch, its result stored.
    let outcomes = receipt_batch(&three_hours, &batch, &declined).await;
    assert!(
        matches!(&outcomes[1], Ok(Outcome::Executed(r)) if r == "receipt-r2"),
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[2], Ok(Outcome::Duplicate(Some(r))) if r == "receipt-r3"),
        "{outcomes:?}"
    );
    assert_eq!(effects_of(&pool, "r2").await, 1);
    assert_eq!(unfinished(&pool, "timed_receipts").await, None);
    let outcomes = receipt_batch(&two_hours, &batch, &declined).await;
    assert!(
        matches!(&outcomes[1], Ok(Outcome::Duplicate(Some(r))) if r == "receipt-r2"),
        "a final row answers a fact outside the window: {:?}",
        outcomes[1]
    );
    for order in ["r1", "r2", "r3"] {
        assert_eq!(effects_of(&pool, order).await, 1, "{order}");
    }
}
