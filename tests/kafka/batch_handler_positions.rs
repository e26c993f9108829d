//! A batch handler's body (one body for the batch's new messages) stores the batch's
//! positions up to the first message that is not done, as the per-message bodies do
//! (`batch_positions`): it knows the keys its transaction claimed, and looks up only the
//! other messages' keys.

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use idem_demo::kafka;
use idem_demo::kafka::handlers::{apply_order_event, event_type_name};
use idem_demo::kafka::producer::event_key;
use idem_demo::orders::{EventType, OrderEvent};
use idem_kafka::{BatchPositions, Position, Schema};
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

const GROUP: &str = "g";

/// The time of the test's facts: one for all, stamped once (to the microsecond), so that
/// an event built again for the same order is the same fact to the handlers, which keep
/// their keys by it.
fn occurred_at() -> DateTime<Utc> {
    static AT: OnceLock<DateTime<Utc>> = OnceLock::new();
    *AT.get_or_init(|| DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap())
}

fn event(order: &str, amount_cents: i64) -> OrderEvent {
    OrderEvent {
        order_id: order.to_owned(),
        event_type: EventType::Paid,
        amount_cents,
        occurred_at: occurred_at(),
        event_key: Some(event_key(order, EventType::Paid).as_uuid()),
    }
}

/// A batch handler in the scope of the demo's handlers (their key, kept by the fact's
/// time), storing the batch's positions first in its body.
#[idempotent(
    key = "event_key, occurred_at",
    event_time = "occurred_at",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "apply_order_event",
    shared_scope = true
)]
async fn apply_events_at_offsets(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    offsets: &BatchPositions,
) -> Result<(), sqlx::Error> {
    let written = async {
        offsets.store_once(&mut *tx).await?;
        let ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
        let types: Vec<&str> = events
            .iter()
            .map(|e| event_type_name(e.event_type))
            .collect();
        let amounts: Vec<i64> = events.iter().map(|e| e.amount_cents).collect();
        sqlx::query(
            "INSERT INTO order_effects (order_id, event_type, amount_cents)
             SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
        )
        .bind(&ids)
        .bind(&types)
        .bind(&amounts)
        .execute(&mut *tx)
        .await
        .map(|_| ())
    };
    let result = written.await;
    if result.is_err() {
        offsets.forget();
    }
    result
}

fn offsets_of(idem: &Idem, batch: &[(i32, i64, OrderEvent)]) -> BatchPositions {
    let schema = Schema::for_idem(idem);
    let positions: Vec<Position> = batch
        .iter()
        .map(|(partition, offset, _)| Position::new(&schema, GROUP, "t", *partition, offset + 1))
        .collect();
    let keys = batch
        .iter()
        .map(|(_, _, event)| apply_events_at_offsets_key(event).ok());
    BatchPositions::of_handler_keys(idem, &positions, keys)
}

async fn stored(pool: &PgPool) -> Vec<(i32, i64)> {
    let mut conn = pool.acquire().await.unwrap();
    let schema = Schema::named("idem_kafka").unwrap();
    let mut stored: Vec<(i32, i64)> = idem_kafka::stored_offsets(&mut conn, &schema, GROUP, "t")
        .await
        .unwrap()
        .into_iter()
        .collect();
    stored.sort_unstable();
    stored
}

async fn setup(pool: &PgPool) -> Idem {
    let idem = Idem::new(pool.clone());
    kafka::prepare(&idem).await.unwrap();
    idem
}

#[sqlx::test(migrations = false)]
async fn a_batch_handler_stores_positions_up_to_the_first_message_not_done(pool: PgPool) {
    let idem = setup(&pool).await;
    // Applied before the batch: `b` (with another amount than below) and `f`.
    apply_order_event(&idem, &event("b", 100)).await.unwrap();
    apply_order_event(&idem, &event("f", 100)).await.unwrap();
    let mut no_key = event("nokey", 100);
    no_key.event_key = None;
    let batch = vec![
        (0, 10, event("a", 100)),
        (0, 11, event("a", 100)), // a duplicate inside the batch
        (0, 12, event("b", 101)), // a payload mismatch: dead-lettered after the commit
        (0, 13, event("c", 100)),
        (1, 20, event("d", 100)),
        (1, 21, no_key), // no key: dead-lettered after the commit
        (1, 22, event("e", 100)),
        (2, 30, event("f", 100)), // a duplicate of an earlier batch
        (2, 31, event("g", 100)),
        (2, 32, event("f", 100)), // a duplicate, last
        (3, 40, event("m", 100)),
        (3, 41, event("m", 101)), // a key this batch claims, with another payload
        (3, 42, event("n", 100)),
        (4, 50, event("p", 100)), // every message new
        (4, 51, event("q", 100)),
    ];
    let offsets = offsets_of(&idem, &batch);
    let events: Vec<OrderEvent> = batch.iter().map(|(_, _, event)| event.clone()).collect();
    let outcomes = apply_events_at_offsets(&idem, &events, &offsets).await;
    let summary: Vec<&str> = outcomes
        .iter()
        .map(|outcome| match outcome {
            Ok(Outcome::Executed(())) => "executed",
            Ok(Outcome::Duplicate(_)) => "duplicate",
            Err(Error::PayloadMismatch { .. }) => "mismatch",
            Err(Error::Key(_)) => "key",
            Err(other) => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "executed",
            "duplicate",
            "mismatch",
            "executed",
            "executed",
            "key",
            "executed",
            "duplicate",
            "executed",
            "duplicate",
            "executed",
            "mismatch",
            "executed",
            "executed",
            "executed"
        ]
    );
    // Partition 0 stops at the mismatch (12), partition 1 at the missing key (21),
    // partition 2 goes past its last message, a duplicate (33), partition 3 stops at the
    // other payload of a key the batch claimed (41), partition 4 goes past its end (52).
    assert_eq!(
        stored(&pool).await,
        vec![(0, 12), (1, 21), (2, 33), (3, 41), (4, 52)]
    );
}

#[sqlx::test(migrations = false)]
async fn a_failing_batch_handler_stores_positions_one_message_at_a_time(pool: PgPool) {
    let idem = setup(&pool).await;
    // `s` cannot be written: the batch rolls back, positions included, and its messages
    // are applied one per transaction, the first of which stores the positions again.
    sqlx::query("ALTER TABLE order_effects ADD CONSTRAINT no_s CHECK (order_id <> 's')")
        .execute(&pool)
        .await
        .unwrap();
    let batch = vec![(0, 60, event("r", 100)), (0, 61, event("s", 100))];
    let offsets = offsets_of(&idem, &batch);
    let events: Vec<OrderEvent> = batch.iter().map(|(_, _, event)| event.clone()).collect();
    let outcomes = apply_events_at_offsets(&idem, &events, &offsets).await;
    assert!(matches!(outcomes[0], Ok(Outcome::Executed(()))));
    assert!(outcomes[1].is_err(), "{:?}", outcomes[1]);
    // `r` committed, `s` did not: up to `s`, not past it.
    assert_eq!(stored(&pool).await, vec![(0, 61)]);
}
