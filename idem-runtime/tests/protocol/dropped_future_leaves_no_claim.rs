//! A delivery whose future is dropped mid-handler (aborted task, timeout, lost select) leaves no claim and no effect; the next delivery executes promptly.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
use idem_runtime::{Idem, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

/// Longer than any rollback of a dropped delivery may take; a claim left behind makes
/// the next delivery wait this long and fail with `InProgress`.
const LOCK_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
struct Delivery {
    event: OrderEvent,
    /// Hang in the body (after the effect is written) instead of returning.
    hang: Option<Checkpoint>,
    runs: Arc<AtomicUsize>,
}

#[idempotent(key = "event.order_id", scope = "ship")]
async fn ship(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, sqlx::Error> {
    delivery.runs.fetch_add(1, Ordering::SeqCst);
    let id = testing::insert_effect(tx, &delivery.event).await?;
    if let Some(checkpoint) = &delivery.hang {
        match checkpoint.reach_and_hang().await {}
    }
    Ok(id)
}

async fn setup(pool: &PgPool) -> Idem {
    let idem = Idem::builder(pool.clone())
        .lock_timeout(LOCK_TIMEOUT)
        .build()
        .unwrap();
    testing::setup_with(idem).await
}

/// The next delivery runs the body, well within the lock timeout, and only its effect and
/// its single attempt are recorded.
async fn assert_next_delivery_executes(
    idem: &Idem,
    pool: &PgPool,
    order_id: &str,
    runs: &Arc<AtomicUsize>,
) {
    let delivery = Delivery {
        event: testing::paid(order_id, 1),
        hang: None,
        runs: runs.clone(),
    };
    let started = Instant::now();
    let outcome = ship(idem, &delivery)
        .await
        .expect("the next delivery must not find a claim");
    assert!(outcome.is_executed(), "{outcome:?}");
    assert!(
        started.elapsed() < LOCK_TIMEOUT / 2,
        "the next delivery waited {:?}",
        started.elapsed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(testing::count_rows(pool, "order_effects").await, 1);
    let key = KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish();
    let record = idem.record("ship", key).await.unwrap().unwrap();
    assert_eq!(record.attempts, 1, "the dropped delivery left a trace");
}

#[sqlx::test(migrations = false)]
async fn aborted_task_leaves_no_claim(pool: PgPool) {
    let idem = setup(&pool).await;
    let checkpoint = Checkpoint::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let delivery = Delivery {
        event: testing::paid("o-abort", 1),
        hang: Some(checkpoint.clone()),
        runs: runs.clone(),
    };

    let task = tokio::spawn({
        let idem = idem.clone();
        async move { ship(&idem, &delivery).await }
    });
    checkpoint.reached().await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());

    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 0);
    assert_next_delivery_executes(&idem, &pool, "o-abort", &runs).await;
}

#[sqlx::test(migrations = false)]
async fn timed_out_delivery_leaves_no_claim(pool: PgPool) {
    let idem = setup(&pool).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let delivery = Delivery {
        event: testing::paid("o-timeout", 1),
        hang: Some(Checkpoint::new()),
        runs: runs.clone(),
    };

    let timed_out = tokio::time::timeout(Duration::from_secs(1), ship(&idem, &delivery)).await;
    assert!(timed_out.is_err());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body was not reached before the timeout"
    );

    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 0);
    assert_next_delivery_executes(&idem, &pool, "o-timeout", &runs).await;
}

#[sqlx::test(migrations = false)]
async fn delivery_dropped_by_select_leaves_no_claim(pool: PgPool) {
    let idem = setup(&pool).await;
    let checkpoint = Checkpoint::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let delivery = Delivery {
        event: testing::paid("o-select", 1),
        hang: Some(checkpoint.clone()),
        runs: runs.clone(),
    };

    // A consumer loop that stops waiting for the handler (shutdown signal, rebalance).
    tokio::select! {
        outcome = ship(&idem, &delivery) => panic!("the hanging body returned: {outcome:?}"),
        () = checkpoint.reached() => {}
    }

    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 0);
    assert_next_delivery_executes(&idem, &pool, "o-select", &runs).await;
}
