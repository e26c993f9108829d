//! A batch handler's body runs once per batch and receives exactly the new messages, in the order of the batch; a batch without new messages neither calls the body nor writes.
use crate::support::batch as batch_handler_support;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::{Calls, all_ok, effects, ids, insert_all, paid_batch};
use idem_runtime::{Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", scope = "record_orders")]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    calls: &Calls,
) -> Result<(), sqlx::Error> {
    calls.record(events);
    insert_all(tx, events).await
}

#[sqlx::test(migrations = false)]
async fn body_runs_once_per_batch_with_exactly_the_new_messages_in_batch_order(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();

    let first = paid_batch(&[("o2", 20)]);
    assert_eq!(
        all_ok(record_orders(&idem, &first, &calls).await),
        vec![Outcome::Executed(())]
    );

    let second = paid_batch(&[("o5", 50), ("o1", 10), ("o2", 20), ("o4", 40), ("o3", 30)]);
    let outcomes = record_orders(&idem, &second, &calls).await;
    assert_eq!(
        all_ok(outcomes),
        vec![
            Outcome::Executed(()),
            Outcome::Executed(()),
            Outcome::Duplicate(None),
            Outcome::Executed(()),
            Outcome::Executed(()),
        ]
    );
    assert_eq!(
        calls.all(),
        vec![ids(&["o2"]), ids(&["o5", "o1", "o4", "o3"])],
        "one body run per batch, with the new messages in batch order"
    );
    assert_eq!(
        effects(&pool).await,
        vec![
            ("o2".into(), 20),
            ("o5".into(), 50),
            ("o1".into(), 10),
            ("o4".into(), 40),
            ("o3".into(), 30),
        ]
    );
    let successes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem.idem_keys WHERE scope = 'record_orders' AND status = 'success' AND attempts = 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(successes, 5);
}

#[sqlx::test(migrations = false)]
async fn batch_without_new_messages_neither_calls_the_body_nor_writes(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let calls = Calls::default();
    let events = paid_batch(&[("o1", 10), ("o2", 20), ("o1", 10)]);
    record_orders(&idem, &events, &calls).await;
    assert_eq!(calls.all(), vec![ids(&["o1", "o2"])]);

    let versions = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT string_agg(xmin::text || '@' || updated_at::text, ',' ORDER BY key) FROM idem.idem_keys",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = versions().await;
    let outcomes = record_orders(&idem, &events, &calls).await;
    assert_eq!(all_ok(outcomes), vec![Outcome::Duplicate(None); 3]);
    assert_eq!(calls.count(), 1, "the body ran without a new message");
    assert_eq!(versions().await, before, "a status row was written");
    assert_eq!(effects(&pool).await.len(), 2);

    // An empty batch has nothing to do either.
    assert!(record_orders(&idem, &[], &calls).await.is_empty());
    assert_eq!(calls.count(), 1);
}
