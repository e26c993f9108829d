//! Messages whose keys already succeeded, through the batch handler or a per-message handler of the same scope, are duplicates: the batch handler's body gets only the others (and knows the duplicates' keys), and a batch of nothing but duplicates does not call it.
use std::sync::Mutex;

use crate::support::batch as batch_handler_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::{Calls, all_ok, effects, ids, insert_all};
use idem_runtime::{CurrentDelivery, IdempotencyKey, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", scope = "orders", shared_scope = true)]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
    seen: &Seen,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    seen.record();
    insert_all(tx, events).await
}

/// What each run of the body found in its [`CurrentDelivery`]: the keys its transaction
/// claimed and the duplicates its claim found.
#[derive(Default)]
struct Seen(Mutex<Vec<(Vec<IdempotencyKey>, Vec<IdempotencyKey>)>>);

impl Seen {
    fn record(&self) {
        let current = CurrentDelivery::get().expect("a body runs in its delivery");
        let claimed = current
            .batch_keys()
            .expect("a batch handler's body")
            .to_vec();
        let duplicates = current.batch_duplicates().expect("a batch handler's body");
        self.0.lock().unwrap().push((claimed, duplicates.to_vec()));
    }

    fn last(&self) -> (Vec<IdempotencyKey>, Vec<IdempotencyKey>) {
        self.0.lock().unwrap().last().cloned().expect("a body ran")
    }
}

fn keys(orders: &[&str]) -> Vec<IdempotencyKey> {
    events(orders)
        .iter()
        .map(|event| record_orders_key(event).unwrap().key())
        .collect()
}

/// One message at a time, in the same scope: its keys are the batch handler's keys. It
/// stores no result either, as a batch handler's keys have none to replay.
#[idempotent(
    key = "order_id, event_type",
    scope = "orders",
    shared_scope = true,
    store_result = false
)]
async fn record_order(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

fn events(orders: &[&str]) -> Vec<OrderEvent> {
    orders
        .iter()
        .map(|&order| testing::paid(order, 7))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn keys_that_succeeded_before_are_duplicates_and_skip_the_body(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let seen = Seen::default();
    all_ok(record_orders(&idem, &events(&["a", "b"]), &calls, &seen).await);
    assert_eq!(seen.last(), (keys(&["a", "b"]), Vec::new()));
    assert!(
        record_order(&idem, &testing::paid("c", 7))
            .await
            .unwrap()
            .is_executed()
    );

    let outcomes = all_ok(
        record_orders(
            &idem,
            &events(&["d", "a", "c", "e", "a", "b"]),
            &calls,
            &seen,
        )
        .await,
    );
    assert_eq!(
        outcomes,
        vec![
            Outcome::Executed(()),
            Outcome::Duplicate(None),
            Outcome::Duplicate(None),
            Outcome::Executed(()),
            Outcome::Duplicate(None),
            Outcome::Duplicate(None),
        ]
    );
    assert_eq!(calls.all(), vec![ids(&["a", "b"]), ids(&["d", "e"])]);
    // The body knows which of the others are done without asking: each duplicate's key
    // once, in message order, whoever committed it.
    assert_eq!(seen.last(), (keys(&["d", "e"]), keys(&["a", "c", "b"])));
    let applied: Vec<String> = effects(&pool).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(applied, ids(&["a", "b", "c", "d", "e"]));

    // Nothing new: no body run, no business row.
    let outcomes = all_ok(record_orders(&idem, &events(&["e", "c", "a"]), &calls, &seen).await);
    assert_eq!(outcomes, vec![Outcome::Duplicate(None); 3]);
    assert_eq!(calls.count(), 2);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 5);

    // And the per-message handler sees the batch handler's keys.
    assert!(
        record_order(&idem, &testing::paid("d", 7))
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 5);
}
