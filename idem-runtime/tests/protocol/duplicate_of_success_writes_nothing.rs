//! A duplicate of a key that already succeeded only reads: it takes no row lock and writes nothing to the status table.
use std::time::{Duration, Instant};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Idem, Outcome, idempotent, key::KeyBuilder};
use sqlx::{Connection, PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", scope = "apply")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

/// The physical identity of the key's row: any update (even one rolled back) or row lock
/// of it changes `xmax`; a committed update also changes `xmin`, `ctid` and `updated_at`.
#[derive(Debug, PartialEq, sqlx::FromRow)]
struct RowVersion {
    xmin: String,
    xmax: String,
    ctid: String,
    attempts: i32,
    updated_at: chrono::DateTime<chrono::Utc>,
}

async fn row_version(pool: &PgPool, event: &OrderEvent) -> RowVersion {
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .part("event_type", &event.event_type)
        .unwrap()
        .finish();
    sqlx::query_as(
        "SELECT xmin::text, xmax::text, ctid::text, attempts, updated_at FROM idem.idem_keys WHERE scope = 'apply' AND key = $1",
    )
    .bind(key.as_uuid())
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn duplicate_of_a_succeeded_key_neither_locks_nor_writes_the_row(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-dup-read", 250);
    let Outcome::Executed(id) = apply(&idem, &event).await.unwrap() else {
        panic!("first delivery must execute");
    };
    let before = row_version(&pool, &event).await;
    assert_eq!(before.xmax, "0", "nothing has locked the committed row yet");

    for _ in 0..3 {
        assert_eq!(
            apply(&idem, &event).await.unwrap(),
            Outcome::Duplicate(Some(id))
        );
    }
    assert_eq!(row_version(&pool, &event).await, before);

    // The probe sees even a row lock that was rolled back: had a duplicate locked the row
    // (`FOR UPDATE`, `FOR SHARE`, `ON CONFLICT DO UPDATE`), the comparison above had failed.
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idem.idem_keys FOR KEY SHARE")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_ne!(row_version(&pool, &event).await.xmax, before.xmax);
}

#[sqlx::test(migrations = false)]
async fn duplicate_of_a_succeeded_key_does_not_wait_for_a_row_lock(pool: PgPool) {
    let lock_timeout = Duration::from_secs(2);
    let idem = testing::setup_with(
        Idem::builder(pool.clone())
            .lock_timeout(lock_timeout)
            .build()
            .unwrap(),
    )
    .await;
    let event = testing::paid("o-dup-lock", 250);
    let Outcome::Executed(id) = apply(&idem, &event).await.unwrap() else {
        panic!("first delivery must execute");
    };

    // Another session holds the strongest row lock on the key's row, as long as it likes.
    let mut holder = PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idem.idem_keys FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();

    // A duplicate that locked or wrote the row would wait for it and give up as InProgress.
    let started = Instant::now();
    assert_eq!(
        apply(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert!(
        started.elapsed() < lock_timeout / 2,
        "the duplicate waited {:?}",
        started.elapsed()
    );

    held.rollback().await.unwrap();
    holder.close().await.unwrap();
}
