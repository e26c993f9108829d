//! A batch handler that changes its key while keeping its keys by the fact's time
//! (`previous_key` with `previous_event_time`): a fact that succeeded under the previous
//! key, in its fact's bucket, is a duplicate when a batch of the new build delivers it,
//! and the new facts of the batch run once. (The two builds are two handlers of one
//! binary here, so they declare the scope shared.)
use chrono::{DurationRound, TimeDelta, Utc};
use idem_runtime::idempotent;
use sqlx::{PgConnection, PgPool};

use crate::support::batch::insert_all;
use crate::support::orders::OrderEvent;
use crate::support::testing;

const SCOPE: &str = "batch_previous_keys_in_time_buckets";

/// The build before: one message at a time, keyed on the order and the fact's time.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "batch_previous_keys_in_time_buckets",
    shared_scope = true
)]
async fn apply_before(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    insert_all(tx, &[event]).await
}

/// The build after: batches, keyed on the order, the event's type and the fact's time.
#[idempotent(
    key = "order_id, event_type, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id, occurred_at",
    previous_event_time = "occurred_at",
    scope = "batch_previous_keys_in_time_buckets",
    shared_scope = true
)]
async fn apply_after(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    insert_all(tx, events).await
}

fn fact(order_id: &str, minutes_ago: i64) -> OrderEvent {
    let mut event = testing::paid(order_id, 100);
    event.occurred_at = (Utc::now() - TimeDelta::minutes(minutes_ago))
        .duration_trunc(TimeDelta::microseconds(1))
        .unwrap();
    event
}

async fn effects_of(pool: &PgPool, order_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM order_effects WHERE order_id = $1")
        .bind(order_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_fact_done_under_the_previous_key_in_its_bucket_is_a_duplicate_in_a_batch(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    // Two facts in two buckets, done by the build before.
    let old = [fact("o-old-1", 90), fact("o-old-2", 10)];
    for event in &old {
        assert!(apply_before(&idem, event).await.unwrap().is_executed());
    }

    // The build after delivers them again in a batch with a new fact.
    let new = fact("o-new", 5);
    let batch = [old[0].clone(), new, old[1].clone()];
    let outcomes = apply_after(&idem, &batch).await;
    assert!(outcomes[0].as_ref().unwrap().is_duplicate(), "{outcomes:?}");
    assert!(outcomes[1].as_ref().unwrap().is_executed(), "{outcomes:?}");
    assert!(outcomes[2].as_ref().unwrap().is_duplicate(), "{outcomes:?}");
    for order_id in ["o-old-1", "o-old-2", "o-new"] {
        assert_eq!(effects_of(&pool, order_id).await, 1, "{order_id}");
    }

    // Nothing of the scope is in the status table.
    let plain: i64 = sqlx::query_scalar("SELECT count(*) FROM idem.idem_keys WHERE scope = $1")
        .bind(SCOPE)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(plain, 0);
}
