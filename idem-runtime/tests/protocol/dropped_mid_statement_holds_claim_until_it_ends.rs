//! A delivery dropped while one of its statements runs keeps its claim until the server finishes that statement: duplicates meanwhile are refused, never run, and the key executes once afterwards.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing::{self, Checkpoint};
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

const LOCK_TIMEOUT: Duration = Duration::from_millis(400);

type Timestamp = chrono::DateTime<chrono::Utc>;

#[derive(Clone)]
struct Delivery {
    event: OrderEvent,
    /// Announce the backend's pid, then run a long statement.
    long_statement: Option<Checkpoint>,
    pid: Arc<Mutex<Option<i32>>>,
}

#[idempotent(key = "event.order_id", scope = "export")]
async fn export(
    tx: &mut PgConnection,
    delivery: &Delivery,
) -> Result<(i64, Timestamp), sqlx::Error> {
    let id = testing::insert_effect(tx, &delivery.event).await?;
    let ran_at = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *tx)
        .await?;
    if let Some(checkpoint) = &delivery.long_statement {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await?;
        *delivery.pid.lock().unwrap() = Some(pid);
        checkpoint.announce();
        sqlx::query("SELECT pg_sleep(2)").execute(&mut *tx).await?;
    }
    Ok((id, ran_at))
}

/// When backend `pid` started the statement it is sleeping in, if it is in `pg_sleep`.
async fn sleeping_since(pool: &PgPool, pid: i32) -> Option<Timestamp> {
    sqlx::query_scalar(
        "SELECT query_start FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'",
    )
    .bind(pid)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn dropped_delivery_holds_its_claim_until_its_statement_ends(pool: PgPool) {
    let idem = Idem::builder(pool.clone())
        .lock_timeout(LOCK_TIMEOUT)
        .build()
        .unwrap();
    let idem = testing::setup_with(idem).await;
    let event = testing::paid("o-mid-statement", 5);
    let checkpoint = Checkpoint::new();
    let dropped = Delivery {
        event: event.clone(),
        long_statement: Some(checkpoint.clone()),
        pid: Arc::default(),
    };

    // Drop the delivery once its backend is inside the long statement.
    let sleep_started = tokio::select! {
        outcome = export(&idem, &dropped) => panic!("the delivery ended: {outcome:?}"),
        inside = async {
            checkpoint.reached().await;
            let pid = dropped.pid.lock().unwrap().expect("pid published");
            loop {
                if let Some(since) = sleeping_since(&pool, pid).await {
                    break since;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } => inside,
    };
    let sleep_ends = sleep_started + chrono::Duration::seconds(2);
    let started = Instant::now();

    let plain = Delivery {
        event,
        long_statement: None,
        pid: Arc::default(),
    };
    let mut refused = 0;
    let executed = loop {
        match export(&idem, &plain).await {
            Err(Error::InProgress { .. }) => refused += 1,
            Ok(Outcome::Executed(executed)) => break executed,
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the claim was never released"
        );
    };
    // The body ran only once the dropped transaction was over.
    assert!(
        executed.1 >= sleep_ends,
        "the body ran at {}, while the dropped statement ran until {sleep_ends}",
        executed.1
    );
    // The server ran the dropped statement to its end (it is not cancelled), so
    // duplicates were refused meanwhile.
    assert!(refused >= 1);
    assert_eq!(
        export(&idem, &plain).await.unwrap(),
        Outcome::Duplicate(Some(executed))
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
}
