//! The batch transaction of the offsets-in-PostgreSQL variant stores each partition's
//! position up to the first message that is not done when it commits (a payload
//! mismatch or a missing key to dead-letter, a failing message to retry), past in-batch
//! and earlier duplicates, and stores nothing when no body runs.

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use idem_demo::kafka;
use idem_demo::kafka::handlers::{
    apply_order_event, apply_order_event_at_offsets_batch, apply_order_event_at_offsets_key,
};
use idem_demo::kafka::producer::event_key;
use idem_demo::orders::{EventType, OrderEvent};
use idem_kafka::{BatchPositions, Position, Schema};
use idem_runtime::{Error, Idem, Outcome};
use sqlx::PgPool;

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

fn offsets_of(idem: &Idem, topic: &str, batch: &[(i32, i64, OrderEvent)]) -> BatchPositions {
    let schema = Schema::for_idem(idem);
    let positions: Vec<Position> = batch
        .iter()
        .map(|(partition, offset, _)| Position::new(&schema, GROUP, topic, *partition, offset + 1))
        .collect();
    let keys = batch
        .iter()
        .map(|(_, _, event)| apply_order_event_at_offsets_key(event).ok());
    BatchPositions::of_handler_keys(idem, &positions, keys)
}

async fn stored(pool: &PgPool) -> std::collections::HashMap<i32, i64> {
    let mut conn = pool.acquire().await.unwrap();
    let schema = Schema::named("idem_kafka").unwrap();
    idem_kafka::stored_offsets(&mut conn, &schema, GROUP, "t")
        .await
        .unwrap()
}

async fn setup(pool: &PgPool) -> Idem {
    let idem = Idem::new(pool.clone());
    kafka::prepare(&idem).await.unwrap();
    idem
}

#[sqlx::test(migrations = false)]
async fn positions_stop_before_dead_letters_and_pass_duplicates(pool: PgPool) {
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
        (2, 32, event("f", 100)), // a duplicate, last: no body runs for it
    ];
    let offsets = offsets_of(&idem, "t", &batch);
    let events: Vec<OrderEvent> = batch.iter().map(|(_, _, event)| event.clone()).collect();
    let outcomes = apply_order_event_at_offsets_batch(&idem, &events, &offsets).await;
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
            "duplicate"
        ]
    );
    let mut stored: Vec<(i32, i64)> = stored(&pool).await.into_iter().collect();
    stored.sort_unstable();
    // Partition 0 stops at the mismatch (12), partition 1 at the missing key (21),
    // partition 2 goes past its last message, a duplicate (33).
    assert_eq!(stored, vec![(0, 12), (1, 21), (2, 33)]);
}

#[sqlx::test(migrations = false)]
async fn positions_stop_before_a_failing_message_of_a_batch(pool: PgPool) {
    let idem = setup(&pool).await;
    let batch = vec![
        (0, 40, event("h", 100)),
        (0, 41, event("i", -5)), // refused: the batch falls back to one message per transaction
        (0, 42, event("j", 100)),
    ];
    let offsets = offsets_of(&idem, "t", &batch);
    let events: Vec<OrderEvent> = batch.iter().map(|(_, _, event)| event.clone()).collect();
    let outcomes = apply_order_event_at_offsets_batch(&idem, &events, &offsets).await;
    assert!(matches!(outcomes[0], Ok(Outcome::Executed(()))));
    assert!(matches!(
        outcomes[1],
        Err(Error::Handler { parked: false, .. })
    ));
    assert!(matches!(outcomes[2], Ok(Outcome::Executed(()))));
    let stored = stored(&pool).await;
    assert_eq!(
        stored.get(&0),
        Some(&41),
        "up to the failing message, not past it"
    );
}

#[sqlx::test(migrations = false)]
async fn a_batch_of_duplicates_stores_nothing(pool: PgPool) {
    let idem = setup(&pool).await;
    apply_order_event(&idem, &event("k", 100)).await.unwrap();
    let batch = vec![(0, 50, event("k", 100)), (0, 51, event("k", 100))];
    let offsets = offsets_of(&idem, "t", &batch);
    let events: Vec<OrderEvent> = batch.iter().map(|(_, _, event)| event.clone()).collect();
    let outcomes = apply_order_event_at_offsets_batch(&idem, &events, &offsets).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Ok(Outcome::Duplicate(_))))
    );
    // No body ran, so nothing was stored in the transaction: the consumer's flush stores
    // these positions.
    let stored = stored(&pool).await;
    assert!(stored.is_empty(), "{stored:?}");
}
