//! Batches whose keys are kept by their facts' times (`event_time`): eight tasks deliver
//! overlapping batches whose facts straddle a bucket boundary, in different orders, at
//! the same time, with no bucket made beforehand (the batches make them, concurrently):
//! every fact applied once, through `batch = true` and through a batch handler, each
//! key in its fact's bucket, nothing in the status table; a last delivery of every fact
//! finds them all, and `done_handler_keys` sees them done.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DurationRound, TimeDelta, Utc};
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Barrier;

use crate::support::batch::insert_all;
use crate::support::orders::OrderEvent;
use crate::support::testing;

const MESSAGES: usize = 240;
const TASKS: usize = 8;
const BATCHES_PER_TASK: usize = 6;
const BATCH: usize = 60;

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_batch_handler"
)]
async fn record_orders(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    insert_all(tx, events).await
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "timed_batch_variant",
    batch = true
)]
async fn record_order(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    insert_all(tx, &[event]).await?;
    Ok(format!("receipt-{}", event.order_id))
}

/// Facts around the last hour boundary (the newest a minute ahead at most): each batch
/// of consecutive facts spans the two buckets.
fn facts(prefix: &str) -> Vec<OrderEvent> {
    let boundary = Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap();
    (0..MESSAGES)
        .map(|i| {
            let mut event = testing::paid(&format!("{prefix}{i:03}"), i as i64);
            event.occurred_at =
                boundary + TimeDelta::milliseconds((i as i64 - MESSAGES as i64 / 2) * 250);
            event
        })
        .collect()
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

/// Runs `deliver` for every task's batches at once; the order ids each delivery executed.
async fn race<F, Fut>(idem: &Idem, all: &[OrderEvent], deliver: F) -> HashMap<String, usize>
where
    F: Fn(Idem, Vec<OrderEvent>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Vec<(String, bool)>> + Send,
{
    let start = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (idem, start, deliver) = (idem.clone(), start.clone(), deliver.clone());
            let batches = batches(task, all);
            tokio::spawn(async move {
                start.wait().await;
                let mut seen = Vec::new();
                for batch in batches {
                    seen.extend(deliver(idem.clone(), batch).await);
                }
                seen
            })
        })
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
    let mut executed: HashMap<String, usize> = HashMap::new();
    for (order, ran) in delivered {
        if ran {
            *executed.entry(order).or_default() += 1;
        }
    }
    executed
}

/// Whether an outcome ran the body; anything but a duplicate or a key in progress fails.
fn ran<T: std::fmt::Debug>(order: &str, outcome: &Result<Outcome<T>, Error<sqlx::Error>>) -> bool {
    match outcome {
        Ok(Outcome::Executed(_)) => true,
        Ok(Outcome::Duplicate(_)) | Err(Error::InProgress { .. }) => false,
        other => panic!("unexpected outcome for {order}: {other:?}"),
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn overlapping_batches_straddling_a_bucket_boundary_apply_each_fact_once(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    let pool: PgPool = pool_options
        .max_connections(TASKS as u32 + 4)
        .connect_with(connect_options)
        .await
        .unwrap();
    let idem = testing::setup(&pool).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idem.idem_timed_buckets").await,
        0,
        "no bucket beforehand"
    );

    // A batch handler.
    let handled = facts("h");
    let executed = race(&idem, &handled, |idem, batch| async move {
        let outcomes = record_orders(&idem, &batch).await;
        assert_eq!(outcomes.len(), batch.len());
        batch
            .iter()
            .zip(&outcomes)
            .map(|(event, outcome)| (event.order_id.clone(), ran(&event.order_id, outcome)))
            .collect()
    })
    .await;
    assert!(
        executed.values().all(|&runs| runs == 1),
        "a fact ran twice: {executed:?}"
    );

    // The batch variant of a handler of one message, its results stored.
    let variant = facts("v");
    let executed = race(&idem, &variant, |idem, batch| async move {
        let outcomes = record_order_batch(&idem, &batch).await;
        batch
            .iter()
            .zip(&outcomes)
            .map(|(event, outcome)| {
                if let Ok(Outcome::Duplicate(receipt)) = outcome {
                    assert_eq!(
                        receipt.as_deref(),
                        Some(format!("receipt-{}", event.order_id).as_str()),
                        "the stored result is replayed"
                    );
                }
                (event.order_id.clone(), ran(&event.order_id, outcome))
            })
            .collect()
    })
    .await;
    assert!(
        executed.values().all(|&runs| runs == 1),
        "a fact ran twice: {executed:?}"
    );

    // A last delivery of everything, as a consumer redelivers what was in progress.
    for outcome in record_orders(&idem, &handled).await {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    for outcome in record_order_batch(&idem, &variant).await {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT order_id, count(*) FROM order_effects GROUP BY order_id ORDER BY order_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(counts.len(), 2 * MESSAGES, "a fact was never applied");
    assert!(
        counts.iter().all(|(_, count)| *count == 1),
        "a fact was applied twice: {:?}",
        counts
            .iter()
            .filter(|(_, count)| *count != 1)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idem.idem_timed_keys").await,
        2 * MESSAGES as i64
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT tableoid) FROM idem.idem_timed_keys"
        )
        .await,
        2,
        "the facts straddle two buckets"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM idem.idem_timed_keys WHERE scope = 'timed_batch_variant' AND result IS NOT NULL"
        )
        .await,
        MESSAGES as i64,
        "each result stored in its fact's bucket"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idem.idem_keys").await,
        0,
        "nothing in the status table"
    );

    // The keys as the handlers derive them are done, each found in its bucket; a fact
    // that never came is not.
    let mut keys: Vec<_> = handled
        .iter()
        .map(|event| record_orders_key(event).unwrap())
        .chain(variant.iter().map(|event| record_order_key(event).unwrap()))
        .collect();
    let mut never = testing::paid("never", 1);
    never.occurred_at = handled[0].occurred_at;
    keys.push(record_orders_key(&never).unwrap());
    let mut conn = pool.acquire().await.unwrap();
    let done = idem.done_handler_keys(&mut conn, &keys).await.unwrap();
    assert_eq!(done.len(), keys.len());
    assert!(done[..2 * MESSAGES].iter().all(|&done| done));
    assert!(!done[2 * MESSAGES]);
}
