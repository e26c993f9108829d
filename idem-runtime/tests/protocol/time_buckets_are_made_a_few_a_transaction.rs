//! Time buckets are made a few a transaction: each one made holds some ten locks until
//! its transaction ends, and PostgreSQL's lock table is shared by the whole server (some
//! 6,400 entries by default). Made all at once, the buckets ahead of a far future bound,
//! or those of a batch whose facts span many narrow buckets, ran the server out of shared
//! memory: every new session of every database failed while they were made. The
//! transaction that made each bucket is the `xmin` of its row in `idem_timed_buckets`.
use std::time::Duration;

use chrono::{DurationRound, TimeDelta, Utc};
use idem_runtime::retention::Retention;
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

use crate::support::batch::insert_all;
use crate::support::orders::OrderEvent;
use crate::support::testing;

/// The most buckets one transaction may make (the store's bound).
const A_TRANSACTION: i64 = 16;

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    scope = "buckets_a_few_a_transaction"
)]
async fn record_orders(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    insert_all(tx, events).await
}

/// The buckets, and the most that one transaction made.
async fn buckets(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(sum(made), 0)::bigint, coalesce(max(made), 0) FROM ( \
            SELECT count(*) AS made FROM idem.idem_timed_buckets GROUP BY xmin::text) AS t",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_buckets_ahead_of_a_far_future_bound(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let retention = Retention::new(Duration::from_secs(7 * 86_400))
        .bucket_width(Duration::from_secs(86_400))
        .future_bound(Duration::from_secs(90 * 86_400));
    let report = idem.purge_with(&retention).await.unwrap();
    let (made, most) = buckets(&pool).await;
    assert_eq!(report.buckets_made as i64, made);
    assert!(
        (91..=92).contains(&made),
        "a day's bucket for 90 days ahead: {made}"
    );
    assert!(
        most <= A_TRANSACTION,
        "{most} buckets made by one transaction"
    );
    // Made: the next upkeep makes none.
    assert_eq!(idem.purge_with(&retention).await.unwrap().buckets_made, 0);
}

#[sqlx::test(migrations = false)]
async fn the_buckets_of_a_batch_spanning_many(pool: PgPool) {
    let idem = testing::setup_with(
        Idem::builder(pool.clone())
            .retention(
                Retention::new(Duration::from_secs(86_400)).bucket_width(Duration::from_secs(60)),
            )
            .build()
            .unwrap(),
    )
    .await;
    // 300 facts a minute apart over the last five hours: 300 one-minute buckets, none
    // made beforehand.
    let now = Utc::now().duration_trunc(TimeDelta::minutes(1)).unwrap();
    let events: Vec<OrderEvent> = (0..300)
        .map(|i| {
            let mut event = testing::paid(&format!("spanning-{i:03}"), i);
            event.occurred_at = now - TimeDelta::minutes(i) + TimeDelta::seconds(30);
            event
        })
        .collect();
    let outcomes = record_orders(&idem, &events).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(Outcome::Executed(_)))),
        "{outcomes:?}"
    );
    let (made, most) = buckets(&pool).await;
    assert_eq!(made, 300);
    assert!(
        most <= A_TRANSACTION,
        "{most} buckets made by one transaction"
    );
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM idem.idem_timed_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(keys, 300);
}
