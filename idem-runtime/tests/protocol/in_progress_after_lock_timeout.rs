//! A duplicate that waits longer than the lock timeout behind an in-flight claim gets `InProgress` instead of piling up; the timeout bounds only the claim.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

const LOCK_TIMEOUT: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error("carrier unavailable")]
    Unavailable,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[derive(Clone)]
struct Delivery {
    event: OrderEvent,
    /// Where the body holds its transaction open.
    hold: Option<Checkpoint>,
    fail: bool,
    /// The `lock_timeout` that the body's statements run with.
    body_lock_timeout: Arc<Mutex<Option<String>>>,
    ran: Arc<AtomicBool>,
}

impl Delivery {
    fn new(event: OrderEvent) -> Self {
        Delivery {
            event,
            hold: None,
            fail: false,
            body_lock_timeout: Arc::default(),
            ran: Arc::default(),
        }
    }
}

#[idempotent(key = "event.order_id", scope = "dispatch")]
async fn dispatch(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, ShipError> {
    delivery.ran.store(true, Ordering::SeqCst);
    let event = &delivery.event;
    let id = testing::insert_effect(tx, event).await?;
    let lock_timeout: String = sqlx::query_scalar("SELECT current_setting('lock_timeout')")
        .fetch_one(&mut *tx)
        .await?;
    *delivery.body_lock_timeout.lock().unwrap() = Some(lock_timeout);
    if let Some(hold) = &delivery.hold {
        hold.reach().await;
    }
    if delivery.fail {
        return Err(ShipError::Unavailable);
    }
    Ok(id)
}

async fn setup(pool_options: PgPoolOptions, connect_options: PgConnectOptions) -> (PgPool, Idem) {
    // A session setting of the application's own, which the claim must not leak into.
    let connect_options = connect_options.options([("lock_timeout", "7s")]);
    let pool = pool_options.connect_with(connect_options).await.unwrap();
    let idem = Idem::builder(pool.clone())
        .lock_timeout(LOCK_TIMEOUT)
        .build()
        .unwrap();
    (pool, testing::setup_with(idem).await)
}

/// Delivers `event` while another delivery holds its claim; expects `InProgress` after
/// about the lock timeout, without running the body.
async fn assert_in_progress(idem: &Idem, event: &OrderEvent) {
    let duplicate = Delivery::new(event.clone());
    let started = Instant::now();
    // Without a lock timeout the duplicate would wait for the holder, which waits for us.
    let error = tokio::time::timeout(LOCK_TIMEOUT * 10, dispatch(idem, &duplicate))
        .await
        .expect("the duplicate waited without a bound")
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(error.disposition(), Disposition::Retry);
    assert!(
        !duplicate.ran.load(Ordering::SeqCst),
        "the duplicate ran its body"
    );
    assert!(
        waited >= LOCK_TIMEOUT - Duration::from_millis(50),
        "gave up after {waited:?}, before the lock timeout"
    );
    assert!(
        waited < LOCK_TIMEOUT + Duration::from_secs(2),
        "waited {waited:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn duplicate_behind_an_inflight_claim_gets_in_progress_after_the_lock_timeout(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    let (pool, idem) = setup(pool_options, connect_options).await;
    let event = testing::paid("o-inflight", 800);
    let hold = Checkpoint::new();
    let first = Delivery {
        hold: Some(hold.clone()),
        ..Delivery::new(event.clone())
    };
    let task = tokio::spawn({
        let (idem, first) = (idem.clone(), first.clone());
        async move { dispatch(&idem, &first).await }
    });
    hold.reached().await;

    assert_in_progress(&idem, &event).await;

    hold.release();
    let Outcome::Executed(id) = task.await.unwrap().unwrap() else {
        panic!("the holder must execute");
    };
    // The claim's lock timeout did not apply to the body's own statements.
    assert_eq!(
        first.body_lock_timeout.lock().unwrap().as_deref(),
        Some("7s")
    );

    let again = Delivery::new(event);
    assert_eq!(
        dispatch(&idem, &again).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}

#[sqlx::test(migrations = false)]
async fn duplicate_behind_a_retry_of_a_failed_key_gets_in_progress(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    let (pool, idem) = setup(pool_options, connect_options).await;
    let event = testing::paid("o-retry", 800);
    let failing = Delivery {
        fail: true,
        ..Delivery::new(event.clone())
    };
    assert!(matches!(
        dispatch(&idem, &failing).await,
        Err(Error::Handler { attempts: 1, .. })
    ));

    // A retry takes the failed key over and holds it.
    let hold = Checkpoint::new();
    let retry = Delivery {
        hold: Some(hold.clone()),
        ..Delivery::new(event.clone())
    };
    let task = tokio::spawn({
        let (idem, retry) = (idem.clone(), retry.clone());
        async move { dispatch(&idem, &retry).await }
    });
    hold.reached().await;
    assert_eq!(
        retry.body_lock_timeout.lock().unwrap().as_deref(),
        Some("7s")
    );

    assert_in_progress(&idem, &event).await;

    hold.release();
    assert!(task.await.unwrap().unwrap().is_executed());
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
