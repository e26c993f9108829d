//! The same key with a different fingerprinted payload is rejected with `PayloadMismatch` and the body does not run.
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, thiserror::Error)]
#[error("refused")]
struct Refused;

#[idempotent(key = "order_id, event_type", fingerprint = "amount_cents")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    testing::insert_effect(tx, event).await
}

#[idempotent(key = "order_id", scope = "refund", fingerprint = "amount_cents")]
async fn refund(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), Refused> {
    let _ = (tx, event);
    Err(Refused)
}

#[sqlx::test(migrations = false)]
async fn same_key_with_another_payload_is_rejected_without_running_the_body(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-mismatch", 500);
    let Outcome::Executed(id) = pay(&idem, &event).await.unwrap() else {
        panic!("first delivery must execute");
    };

    // Same key (order and event type), another amount.
    let altered = OrderEvent {
        amount_cents: 501,
        ..event.clone()
    };
    let error = pay(&idem, &altered).await.unwrap_err();
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .part("event_type", &event.event_type)
        .unwrap()
        .finish();
    assert!(
        matches!(error, Error::PayloadMismatch { key: k } if k == key),
        "{error:?}"
    );
    assert_eq!(error.disposition(), Disposition::DeadLetter);
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        1,
        "the body ran for a mismatched payload"
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);

    // A field outside the key and the fingerprint may differ: still a duplicate.
    let redelivered = OrderEvent {
        occurred_at: event.occurred_at + chrono::Duration::seconds(30),
        ..event
    };
    assert_eq!(
        pay(&idem, &redelivered).await.unwrap(),
        Outcome::Duplicate(Some(id))
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}

#[sqlx::test(migrations = false)]
async fn a_failed_key_keeps_its_fingerprint_and_rejects_another_payload(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-refund", 300);
    assert!(matches!(
        refund(&idem, &event).await,
        Err(Error::Handler { attempts: 1, .. })
    ));

    let altered = OrderEvent {
        amount_cents: 299,
        ..event.clone()
    };
    let error = refund(&idem, &altered).await.unwrap_err();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");

    // The mismatch recorded nothing: the key still has one failed attempt.
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let record = idem.record("refund", key).await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Failed, 1));
}
