//! 64 concurrent deliveries of the same message, through 16 runtime handles as 16 processes would make them, run the handler body exactly once; every caller gets executed-or-duplicate.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Barrier;

const DELIVERIES: usize = 64;
const CONNECTIONS: u32 = 16;

/// One delivery of the event, with the test's probes.
struct Delivery {
    event: OrderEvent,
    runs: Arc<AtomicUsize>,
    checkpoint: Checkpoint,
}

#[idempotent(key = "event.order_id, event.event_type")]
async fn apply(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, sqlx::Error> {
    let id = testing::insert_effect(tx, &delivery.event).await?;
    if delivery.runs.fetch_add(1, Ordering::SeqCst) == 0 {
        // Hold the claim until the other deliveries are queued up behind it.
        delivery.checkpoint.reach().await;
    }
    Ok(id)
}

/// Backends of this database waiting for a lock (on the claimed key).
async fn lock_waiters(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn sixty_four_concurrent_deliveries_run_the_body_exactly_once(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    let pool = pool_options
        .max_connections(CONNECTIONS)
        .connect_with(connect_options)
        .await
        .unwrap();
    testing::setup(&pool).await;
    // One handle per connection, as separate processes would have: deliveries of one
    // handle take turns in the process, the handles meet at the claim's row lock.
    let handles: Vec<Idem> = (0..CONNECTIONS).map(|_| Idem::new(pool.clone())).collect();
    let runs = Arc::new(AtomicUsize::new(0));
    let checkpoint = Checkpoint::new();
    let start = Arc::new(Barrier::new(DELIVERIES));
    let event = testing::paid("o-64", 1_200);

    let tasks: Vec<_> = (0..DELIVERIES)
        .map(|n| {
            let (idem, start): (Idem, _) = (handles[n % handles.len()].clone(), start.clone());
            let delivery = Delivery {
                event: event.clone(),
                runs: runs.clone(),
                checkpoint: checkpoint.clone(),
            };
            tokio::spawn(async move {
                start.wait().await;
                apply(&idem, &delivery).await
            })
        })
        .collect();

    // The first body holds its transaction open; the first delivery of every other handle
    // must end up blocked behind its claim before it commits.
    checkpoint.reached().await;
    let observer = PgPool::connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let waiting = tokio::time::timeout(Duration::from_secs(10), async {
        while lock_waiters(&observer).await < i64::from(CONNECTIONS) - 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        waiting.is_ok(),
        "the other deliveries never queued behind the claim"
    );
    checkpoint.release();

    let mut executed = Vec::new();
    let mut duplicates = Vec::new();
    for task in tasks {
        match task.await.unwrap().unwrap() {
            Outcome::Executed(id) => executed.push(id),
            Outcome::Duplicate(id) => duplicates.push(id),
        }
    }
    observer.close().await;

    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert_eq!(executed.len(), 1);
    assert_eq!(duplicates.len(), DELIVERIES - 1);
    // Every duplicate is told the result of the one execution.
    assert!(duplicates.iter().all(|id| *id == Some(executed[0])));
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 1);
}
