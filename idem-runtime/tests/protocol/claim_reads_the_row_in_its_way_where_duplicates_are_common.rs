//! Where duplicates are not rare in a scope (from one delivery in eight), the claim reads
//! the row in its way in the same statement: every answer stays the one a row decides, in
//! the status table and in the time buckets. A duplicate replays the stored result, a
//! payload that differs is refused, a failed key is taken over and runs once more, a parked
//! key is refused without running, and a fact outside its window is refused.
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, TimeDelta, Utc};
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

use crate::support::testing;

#[derive(Debug, thiserror::Error)]
#[error("upstream refused order {0}")]
struct Refused(String);

struct Order<'a> {
    order_id: String,
    at: DateTime<Utc>,
    amount: i64,
    fail: bool,
    runs: &'a AtomicUsize,
}

#[idempotent(
    key = "order_id",
    fingerprint = "amount",
    scope = "common.plain",
    max_attempts = 3
)]
async fn plain(tx: &mut PgConnection, order: &Order<'_>) -> Result<i64, Refused> {
    run(tx, order).await
}

#[idempotent(
    key = "order_id, at",
    event_time = "at",
    fingerprint = "amount",
    scope = "common.timed",
    max_attempts = 3
)]
async fn timed(tx: &mut PgConnection, order: &Order<'_>) -> Result<i64, Refused> {
    run(tx, order).await
}

async fn run(tx: &mut PgConnection, order: &Order<'_>) -> Result<i64, Refused> {
    order.runs.fetch_add(1, Ordering::SeqCst);
    if order.fail {
        return Err(Refused(order.order_id.clone()));
    }
    testing::insert_effect(tx, &testing::paid(&order.order_id, order.amount))
        .await
        .map_err(|error| Refused(error.to_string()))
}

type Deliver = for<'a> fn(
    &'a Idem,
    &'a Order<'a>,
) -> std::pin::Pin<
    Box<dyn Future<Output = idem_runtime::Handled<Result<i64, Refused>>> + Send + 'a>,
>;

async fn every_answer_with_common_duplicates(idem: &Idem, deliver: Deliver, label: &str) {
    let runs = AtomicUsize::new(0);
    let at = Utc::now();
    let order = |id: &str, amount: i64, fail: bool| Order {
        order_id: format!("{label}-{id}"),
        at,
        amount,
        fail,
        runs: &runs,
    };
    // Three deliveries in ten duplicates: the scope's claims read the row in their way.
    for n in 0..60 {
        let new = order(&format!("warm-{n}"), 1, false);
        deliver(idem, &new).await.unwrap();
        if n % 3 == 0 {
            assert!(matches!(
                deliver(idem, &new).await.unwrap(),
                Outcome::Duplicate(_)
            ));
        }
    }

    // A duplicate replays the stored result, without running.
    let first = order("dup", 7, false);
    let Outcome::Executed(id) = deliver(idem, &first).await.unwrap() else {
        panic!("a new key runs")
    };
    let before = runs.load(Ordering::SeqCst);
    assert_eq!(
        deliver(idem, &first).await.unwrap(),
        Outcome::Duplicate(Some(id)),
        "{label}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), before);

    // Another payload under the same key is refused.
    let other = order("dup", 8, false);
    assert!(matches!(
        deliver(idem, &other).await,
        Err(Error::PayloadMismatch { .. })
    ));

    // A failed key is taken over and runs again; once succeeded, a duplicate.
    let failing = order("retry", 1, true);
    assert!(matches!(
        deliver(idem, &failing).await,
        Err(Error::Handler { parked: false, .. })
    ));
    let fixed = order("retry", 1, false);
    assert!(matches!(
        deliver(idem, &fixed).await.unwrap(),
        Outcome::Executed(_)
    ));
    assert!(matches!(
        deliver(idem, &fixed).await.unwrap(),
        Outcome::Duplicate(_)
    ));

    // A parked key is refused without running.
    let doomed = order("park", 1, true);
    for _ in 0..3 {
        assert!(matches!(
            deliver(idem, &doomed).await,
            Err(Error::Handler { .. })
        ));
    }
    let before = runs.load(Ordering::SeqCst);
    assert!(matches!(
        deliver(idem, &doomed).await,
        Err(Error::Parked { .. })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), before);
}

#[sqlx::test(migrations = false)]
async fn in_the_status_table(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    every_answer_with_common_duplicates(&idem, |idem, order| Box::pin(plain(idem, order)), "plain")
        .await;
}

#[sqlx::test(migrations = false)]
async fn in_the_time_buckets(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    every_answer_with_common_duplicates(&idem, |idem, order| Box::pin(timed(idem, order)), "timed")
        .await;
    // A fact older than its window is refused, and never runs.
    let runs = AtomicUsize::new(0);
    let old = Order {
        order_id: "timed-old".to_owned(),
        at: Utc::now() - TimeDelta::days(30),
        amount: 1,
        fail: false,
        runs: &runs,
    };
    assert!(matches!(
        timed(&idem, &old).await,
        Err(Error::OutsideWindow { .. })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
