//! While most deliveries of a scope are duplicates (a consumer replaying a partition), a
//! duplicate is answered by one read of the key's row, outside any transaction; new
//! messages mixed into the storm still run exactly once.
use std::time::Duration;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", scope = "replayed")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

/// The transactions of the test's database that ended in a rollback, once every backend
/// but the caller's has flushed its statistics (a backend flushes them when it exits).
async fn rollbacks(pool: &PgPool) -> i64 {
    for _ in 0..200 {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'replay'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if others == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sqlx::query_scalar(
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A handle on a pool of its own (one connection), closed by the caller to flush its
/// statistics.
async fn replaying_handle(pool: &PgPool) -> Idem {
    let options: PgConnectOptions = pool.connect_options().as_ref().clone();
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.application_name("replay"))
        .await
        .unwrap();
    Idem::new(own)
}

#[sqlx::test(migrations = false)]
async fn duplicates_of_a_replayed_partition_open_no_transaction(pool: PgPool) {
    let _ = testing::setup(&pool).await;
    let events: Vec<OrderEvent> = (0..10)
        .map(|i| testing::paid(&format!("o-replay-{i}"), 100 + i))
        .collect();
    let idem = replaying_handle(&pool).await;
    let mut ids = Vec::new();
    for event in &events {
        let Outcome::Executed(id) = apply(&idem, event).await.unwrap() else {
            panic!("the first delivery of {} executes", event.order_id);
        };
        ids.push(id);
    }
    idem.pool().close().await;
    let before = rollbacks(&pool).await;

    // The replay: every event again, ten times over.
    let idem = replaying_handle(&pool).await;
    for _ in 0..10 {
        for (event, id) in events.iter().zip(&ids) {
            assert_eq!(
                apply(&idem, event).await.unwrap(),
                Outcome::Duplicate(Some(*id))
            );
        }
    }
    idem.pool().close().await;
    let rolled_back = rollbacks(&pool).await - before;
    // The first few duplicates, before the scope's rate turns, are found by the claim in a
    // transaction that rolls back; the rest by a read that opens none.
    assert!(
        (3..=20).contains(&rolled_back),
        "100 duplicates rolled back {rolled_back} transactions: expected the first few only"
    );
    assert_eq!(
        testing::count_rows(&pool, "order_effects").await,
        10,
        "one effect per event"
    );
}

#[sqlx::test(migrations = false)]
async fn new_messages_racing_inside_a_replay_run_once(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let old: Vec<OrderEvent> = (0..20)
        .map(|i| testing::paid(&format!("o-old-{i}"), i))
        .collect();
    for event in &old {
        apply(&idem, event).await.unwrap();
    }
    // Turn the scope to reading first.
    for event in old.iter().cycle().take(40) {
        assert!(matches!(
            apply(&idem, event).await.unwrap(),
            Outcome::Duplicate(Some(_))
        ));
    }
    // Eight deliveries of each new event race, among more duplicates of old ones.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10 {
        let fresh = testing::paid(&format!("o-new-{i}"), 1000 + i);
        for _ in 0..8 {
            let (idem, fresh) = (idem.clone(), fresh.clone());
            tasks.spawn(async move { apply(&idem, &fresh).await });
        }
        let (idem, replayed) = (idem.clone(), old[i as usize].clone());
        tasks.spawn(async move { apply(&idem, &replayed).await });
    }
    let mut executed = 0;
    while let Some(outcome) = tasks.join_next().await {
        match outcome.unwrap() {
            Ok(Outcome::Executed(_)) => executed += 1,
            Ok(Outcome::Duplicate(_)) | Err(idem_runtime::Error::InProgress { .. }) => {}
            Err(error) => panic!("unexpected failure: {error}"),
        }
    }
    assert_eq!(executed, 10, "each new event executes once");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 30);
    let new_effects: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT order_id) FROM order_effects WHERE order_id LIKE 'o-new-%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(new_effects, 10);
}
