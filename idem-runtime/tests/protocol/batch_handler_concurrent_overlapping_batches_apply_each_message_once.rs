//! Several tasks delivering overlapping batches, in different orders, at the same time to a batch handler apply every message's effect exactly once, without a deadlock.
use crate::support::batch as batch_handler_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use batch_handler_support::insert_all;
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Barrier;

const MESSAGES: usize = 240;
const TASKS: usize = 8;
const BATCHES_PER_TASK: usize = 6;
const BATCH: usize = 60;

#[idempotent(key = "order_id, event_type")]
async fn record_orders(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    insert_all(tx, events).await
}

/// The batches of `task`: overlapping windows over all messages, every other task
/// walking them backwards, so that the same keys arrive in different orders.
fn batches(task: usize, all: &[OrderEvent]) -> Vec<Vec<OrderEvent>> {
    (0..BATCHES_PER_TASK)
        .map(|round| {
            let start = (task * 17 + round * 37) % MESSAGES;
            let mut batch: Vec<OrderEvent> = (0..BATCH)
                .map(|i| all[(start + i) % MESSAGES].clone())
                .collect();
            if task % 2 == 1 {
                batch.reverse();
            }
            batch
        })
        .collect()
}

/// Delivers `batches` one after the other; returns the outcomes per order id.
async fn deliver(
    idem: Idem,
    batches: Vec<Vec<OrderEvent>>,
    start: Arc<Barrier>,
) -> Vec<(String, Result<Outcome<()>, Error<sqlx::Error>>)> {
    start.wait().await;
    let mut seen = Vec::new();
    for batch in batches {
        let outcomes = record_orders(&idem, &batch).await;
        assert_eq!(outcomes.len(), batch.len());
        seen.extend(batch.into_iter().map(|e| e.order_id).zip(outcomes));
    }
    seen
}

#[sqlx::test(migrations = false)]
async fn overlapping_batches_delivered_concurrently_apply_each_message_once(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    let pool: PgPool = pool_options
        .max_connections(TASKS as u32 + 2)
        .connect_with(connect_options)
        .await
        .unwrap();
    let idem = testing::setup(&pool).await;
    let all: Vec<OrderEvent> = (0..MESSAGES)
        .map(|i| testing::paid(&format!("o{i:03}"), i as i64))
        .collect();
    let start = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| tokio::spawn(deliver(idem.clone(), batches(task, &all), start.clone())))
        .collect();
    let delivered = tokio::time::timeout(Duration::from_secs(120), async {
        let mut delivered = Vec::new();
        for task in tasks {
            delivered.extend(task.await.unwrap());
        }
        delivered
    })
    .await
    .expect("the concurrent batches did not finish: a deadlock or a hang");

    // Each message ran at most once; a delivery that waited longer than the lock timeout
    // for another one's claim may be told to retry, nothing else.
    let mut executed: HashMap<String, usize> = HashMap::new();
    for (order, outcome) in &delivered {
        match outcome {
            Ok(Outcome::Executed(())) => *executed.entry(order.clone()).or_default() += 1,
            Ok(Outcome::Duplicate(None)) | Err(Error::InProgress { .. }) => {}
            other => panic!("unexpected outcome for {order}: {other:?}"),
        }
    }
    assert!(
        executed.values().all(|&runs| runs == 1),
        "a message executed twice: {executed:?}"
    );

    // A final delivery of everything, as a consumer redelivers what was in progress.
    for outcome in record_orders(&idem, &all).await {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT order_id, count(*) FROM order_effects GROUP BY order_id ORDER BY order_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(counts.len(), MESSAGES, "a message was never applied");
    assert!(
        counts.iter().all(|(_, count)| *count == 1),
        "a message was applied twice: {:?}",
        counts
            .iter()
            .filter(|(_, count)| *count != 1)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        testing::count_rows(&pool, "idem.idem_keys").await,
        MESSAGES as i64
    );
}
