//! A deadlock or serialization failure in the body rolls the transaction back and runs it again, a bounded number of times.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent, key::KeyBuilder};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Barrier;

/// Moves one unit between two accounts, locking `from` first and `to` second.
#[derive(Clone)]
struct Transfer {
    id: String,
    from: i32,
    to: i32,
    /// Both transfers meet here on their first run, each holding its first row lock.
    both_locked: Arc<Barrier>,
    runs: Arc<AtomicUsize>,
}

#[idempotent(key = "id", scope = "transfer")]
async fn transfer(tx: &mut PgConnection, transfer: &Transfer) -> Result<(), sqlx::Error> {
    let run = transfer.runs.fetch_add(1, Ordering::SeqCst);
    sqlx::query("UPDATE accounts SET balance = balance - 1 WHERE id = $1")
        .bind(transfer.from)
        .execute(&mut *tx)
        .await?;
    if run == 0 {
        transfer.both_locked.wait().await;
    }
    sqlx::query("UPDATE accounts SET balance = balance + 1, credits = credits + 1 WHERE id = $1")
        .bind(transfer.to)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO transfers (id) VALUES ($1)")
        .bind(&transfer.id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

struct Conflicted<'a> {
    id: &'a str,
    runs: &'a AtomicUsize,
}

#[idempotent(key = "id", scope = "always_conflicts")]
async fn always_conflicts(
    tx: &mut PgConnection,
    message: &Conflicted<'_>,
) -> Result<(), sqlx::Error> {
    message.runs.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, &testing::paid(message.id, 1)).await?;
    sqlx::query("DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure'; END $$")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn deadlocked_transfers_are_retried_and_apply_exactly_once(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    // Detect the deadlock quickly.
    let pool = pool_options
        .connect_with(connect_options.options([("deadlock_timeout", "100ms")]))
        .await
        .unwrap();
    let idem = testing::setup(&pool).await;
    sqlx::raw_sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, credits int NOT NULL);
         INSERT INTO accounts VALUES (1, 10, 0), (2, 10, 0);
         CREATE TABLE transfers (id text NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();

    let both_locked = Arc::new(Barrier::new(2));
    let runs = Arc::new(AtomicUsize::new(0));
    let transfers = [("t-1-to-2", 1, 2), ("t-2-to-1", 2, 1)].map(|(id, from, to)| Transfer {
        id: id.into(),
        from,
        to,
        both_locked: both_locked.clone(),
        runs: Arc::new(AtomicUsize::new(0)),
    });
    let tasks = transfers.clone().map(|t| {
        let idem: Idem = idem.clone();
        let runs = runs.clone();
        tokio::spawn(async move {
            let outcome = transfer(&idem, &t).await;
            runs.fetch_add(t.runs.load(Ordering::SeqCst), Ordering::SeqCst);
            outcome
        })
    });
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), Outcome::Executed(()));
    }

    // One of the two was the deadlock victim and ran again; the other ran once.
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "no deadlock happened, or a body ran too often"
    );
    let accounts: Vec<(i32, i32)> =
        sqlx::query_as("SELECT balance, credits FROM accounts ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(accounts, [(10, 1), (10, 1)]);
    assert_eq!(testing::count_rows(&pool, "transfers").await, 2);
    for t in &transfers {
        let key = KeyBuilder::new().part("id", &t.id).unwrap().finish();
        let record = idem.record("transfer", key).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.attempts, record.last_error),
            (Status::Success, 1, None)
        );
        // Redelivery after the retry is a plain duplicate.
        assert_eq!(
            transfer(&idem, t).await.unwrap(),
            Outcome::Duplicate(Some(()))
        );
    }
}

#[sqlx::test(migrations = false)]
async fn a_body_that_always_hits_serialization_failures_ends_as_a_recorded_failure(pool: PgPool) {
    let idem = testing::setup_with(
        Idem::builder(pool.clone())
            .transient_retries(2)
            .build()
            .unwrap(),
    )
    .await;
    let runs = AtomicUsize::new(0);
    let message = Conflicted {
        id: "o-conflicted",
        runs: &runs,
    };

    let error = always_conflicts(&idem, &message).await.unwrap_err();
    let Error::Handler {
        source,
        attempts,
        parked,
    } = &error
    else {
        panic!("expected a handler error, got {error:?}");
    };
    assert_eq!(
        source
            .as_database_error()
            .and_then(|db| db.code())
            .as_deref(),
        Some("40001")
    );
    assert_eq!((*attempts, *parked), (1, false));
    assert_eq!(error.disposition(), Disposition::Retry);
    assert_eq!(runs.load(Ordering::SeqCst), 3, "one run and two retries");

    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);
    let key = KeyBuilder::new()
        .part("id", "o-conflicted")
        .unwrap()
        .finish();
    let record = idem.record("always_conflicts", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Failed, 1));
    assert!(
        record
            .last_error
            .unwrap()
            .contains("could not serialize access")
    );
}
