//! After `max_attempts` failures a key is parked: deliveries are refused without running the body until `Idem::reset`.
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Idem, Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, thiserror::Error)]
#[error("upstream rejected order {0}")]
struct Rejected(String);

struct Delivery<'a> {
    order_id: &'a str,
    fail: bool,
    runs: &'a AtomicUsize,
}

#[idempotent(key = "order_id", scope = "settle", max_attempts = 2)]
async fn settle(tx: &mut PgConnection, delivery: &Delivery<'_>) -> Result<(), Rejected> {
    delivery.runs.fetch_add(1, Ordering::SeqCst);
    let event = testing::paid(delivery.order_id, 10);
    testing::insert_effect(tx, &event)
        .await
        .map_err(|e| Rejected(e.to_string()))?;
    if delivery.fail {
        return Err(Rejected(delivery.order_id.to_owned()));
    }
    Ok(())
}

#[idempotent(key = "order_id", scope = "settle_default")]
async fn settle_with_default_attempts(
    tx: &mut PgConnection,
    delivery: &Delivery<'_>,
) -> Result<(), Rejected> {
    delivery.runs.fetch_add(1, Ordering::SeqCst);
    let _ = tx;
    Err(Rejected(delivery.order_id.to_owned()))
}

#[sqlx::test(migrations = false)]
async fn key_is_parked_after_max_attempts_until_reset(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let runs = AtomicUsize::new(0);
    let failing = Delivery {
        order_id: "o-park",
        fail: true,
        runs: &runs,
    };
    let key = KeyBuilder::new()
        .part("order_id", "o-park")
        .unwrap()
        .finish();

    let first = settle(&idem, &failing).await.unwrap_err();
    assert!(
        matches!(
            first,
            Error::Handler {
                attempts: 1,
                parked: false,
                ..
            }
        ),
        "{first:?}"
    );
    assert_eq!(first.disposition(), Disposition::Retry);

    let second = settle(&idem, &failing).await.unwrap_err();
    assert!(
        matches!(
            second,
            Error::Handler {
                attempts: 2,
                parked: true,
                ..
            }
        ),
        "{second:?}"
    );
    assert_eq!(second.disposition(), Disposition::DeadLetter);
    assert_eq!(
        idem.record("settle", key).await.unwrap().unwrap().status,
        Status::Parked
    );

    // Parked: refused without running the body, even a delivery that would now succeed.
    let healthy = Delivery {
        order_id: "o-park",
        fail: false,
        runs: &runs,
    };
    for delivery in [&failing, &healthy] {
        let refused = settle(&idem, delivery).await.unwrap_err();
        let Error::Parked {
            key: parked_key,
            attempts,
            last_error,
        } = &refused
        else {
            panic!("expected a parked key, got {refused:?}");
        };
        assert_eq!((*parked_key, *attempts), (key, 2));
        assert_eq!(last_error, "upstream rejected order o-park");
        assert_eq!(refused.disposition(), Disposition::DeadLetter);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a parked key ran its body");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);

    // Reset un-parks; the next delivery runs the body and succeeds.
    assert!(idem.reset("settle", key).await.unwrap());
    assert_eq!(
        settle(&idem, &healthy).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);
    let record = idem.record("settle", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Success, 1));
    // A succeeded key is not reset.
    assert!(!idem.reset("settle", key).await.unwrap());
}

#[sqlx::test(migrations = false)]
async fn runtime_max_attempts_applies_when_the_handler_sets_none(pool: PgPool) {
    let idem =
        testing::setup_with(Idem::builder(pool.clone()).max_attempts(3).build().unwrap()).await;
    let runs = AtomicUsize::new(0);
    let failing = Delivery {
        order_id: "o-default",
        fail: true,
        runs: &runs,
    };

    for attempt in 1..=3 {
        let error = settle_with_default_attempts(&idem, &failing)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::Handler { attempts, parked, .. } if attempts == attempt && parked == (attempt == 3)),
            "attempt {attempt}: {error:?}"
        );
    }
    let refused = settle_with_default_attempts(&idem, &failing)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::Parked { attempts: 3, .. }),
        "{refused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
