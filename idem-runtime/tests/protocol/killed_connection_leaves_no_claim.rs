//! A handler whose database connection is killed mid-transaction returns an error, leaves no claim and no effect, and the next delivery succeeds.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

const LOCK_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
struct Delivery {
    event: OrderEvent,
    /// Where the body waits, its backend's pid published, for the test to kill it.
    kill_point: Option<Checkpoint>,
    /// Wait inside a statement (`pg_sleep`) rather than between statements.
    in_statement: bool,
    pid: Arc<Mutex<Option<i32>>>,
}

impl Delivery {
    fn new(event: OrderEvent) -> Self {
        Delivery {
            event,
            kill_point: None,
            in_statement: false,
            pid: Arc::default(),
        }
    }
}

#[idempotent(key = "event.order_id", scope = "book")]
async fn book(tx: &mut PgConnection, delivery: &Delivery) -> Result<i64, sqlx::Error> {
    let event = &delivery.event;
    let id = testing::insert_effect(tx, event).await?;
    if let Some(kill_point) = &delivery.kill_point {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await?;
        *delivery.pid.lock().unwrap() = Some(pid);
        if delivery.in_statement {
            // Announced before the statement starts; the test waits until it runs.
            kill_point.announce();
            sqlx::query("SELECT pg_sleep(30)").execute(&mut *tx).await?;
        } else {
            kill_point.reach().await;
        }
    }
    Ok(id)
}

async fn setup(pool: &PgPool) -> Idem {
    testing::setup_with(
        Idem::builder(pool.clone())
            .lock_timeout(LOCK_TIMEOUT)
            .build()
            .unwrap(),
    )
    .await
}

/// Terminates `pid` from a connection of its own and waits until the backend is gone.
async fn kill(pool: &PgPool, pid: i32) {
    let mut killer = pool.acquire().await.unwrap();
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut *killer)
        .await
        .unwrap();
    assert!(terminated, "backend {pid} did not terminate");
}

async fn assert_next_delivery_succeeds(
    idem: &Idem,
    pool: &PgPool,
    event: &OrderEvent,
    attempts: u32,
) {
    let started = Instant::now();
    let next = Delivery::new(event.clone());
    let outcome = book(idem, &next)
        .await
        .expect("the next delivery must succeed");
    assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
    assert!(
        started.elapsed() < LOCK_TIMEOUT / 2,
        "the next delivery waited {:?}",
        started.elapsed()
    );
    assert_eq!(testing::count_rows(pool, "order_effects").await, 1);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let record = idem.record("book", key).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.attempts),
        (Status::Success, attempts)
    );
}

#[sqlx::test(migrations = false)]
async fn connection_killed_between_statements_fails_the_commit_and_leaves_nothing(pool: PgPool) {
    let idem = setup(&pool).await;
    let event = testing::paid("o-killed-idle", 10);
    let kill_point = Checkpoint::new();
    let delivery = Delivery {
        kill_point: Some(kill_point.clone()),
        ..Delivery::new(event.clone())
    };
    let task = tokio::spawn({
        let (idem, delivery) = (idem.clone(), delivery.clone());
        async move { book(&idem, &delivery).await }
    });

    kill_point.reached().await;
    let pid = delivery
        .pid
        .lock()
        .unwrap()
        .expect("the body published its pid");
    kill(&pool, pid).await;
    kill_point.release();

    // The body returned Ok, but its commit cannot have happened.
    let error = task.await.unwrap().unwrap_err();
    assert!(matches!(error, Error::Database(_)), "{error:?}");
    assert_eq!(error.disposition(), Disposition::Retry);
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 0);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);

    assert_next_delivery_succeeds(&idem, &pool, &event, 1).await;
}

#[sqlx::test(migrations = false)]
async fn connection_killed_during_a_statement_counts_no_attempt_and_leaves_no_claim(pool: PgPool) {
    let idem = setup(&pool).await;
    let event = testing::paid("o-killed-busy", 10);
    let kill_point = Checkpoint::new();
    let delivery = Delivery {
        kill_point: Some(kill_point.clone()),
        in_statement: true,
        ..Delivery::new(event.clone())
    };
    let task = tokio::spawn({
        let (idem, delivery) = (idem.clone(), delivery.clone());
        async move { book(&idem, &delivery).await }
    });

    kill_point.reached().await;
    let pid = delivery
        .pid
        .lock()
        .unwrap()
        .expect("the body published its pid");
    // Wait until the backend is inside pg_sleep.
    let sleeping = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let waiting: Option<String> =
                sqlx::query_scalar("SELECT wait_event FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            if waiting.as_deref() == Some("PgSleep") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(sleeping.is_ok(), "the body never got into its statement");
    let started = Instant::now();
    kill(&pool, pid).await;

    // The body's statement failed: a handler failure, but not the message's fault, so no
    // attempt is counted (a failover must not park healthy messages).
    let error = task.await.unwrap().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the delivery hung after the kill"
    );
    let Error::Handler {
        attempts, parked, ..
    } = &error
    else {
        panic!("expected a handler failure, got {error:?}");
    };
    assert_eq!((*attempts, *parked), (0, false));
    assert_eq!(error.disposition(), Disposition::Retry);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    assert_eq!(
        idem.record("book", key).await.unwrap(),
        None,
        "a claim was left behind"
    );

    assert_next_delivery_succeeds(&idem, &pool, &event, 1).await;
}
