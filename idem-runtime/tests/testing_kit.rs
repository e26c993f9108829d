//! The testing kit (`idem_runtime::testing`) used the way an application tests its own
//! handlers: the README's handlers, each checked with every assertion and under every
//! fault, and handlers that are not idempotent, caught.
//!
//! `#[sqlx::test]` gives each test a database of its own, with the business tables of
//! `tests/testing_kit/migrations` applied; `testing::idem` migrates the status table.

use idem_runtime::lease::Lease;
use idem_runtime::testing::{self, Effects, Fault};
use idem_runtime::{Error, Handled, Idem, IdempotencyKey, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone)]
struct OrderEvent {
    order_id: String,
    event_type: String,
    amount_cents: i64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct PaymentError(#[from] sqlx::Error);

/// The README's handler.
#[idempotent(key = "order_id, event_type")]
async fn apply_payment(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, PaymentError> {
    let payment_id =
        sqlx::query_scalar("INSERT INTO payments (order_id, cents) VALUES ($1, $2) RETURNING id")
            .bind(&event.order_id)
            .bind(event.amount_cents)
            .fetch_one(&mut *tx)
            .await?;
    Ok(Receipt { payment_id })
}

/// The README's batch handler: one statement for all the new payments of a batch.
#[idempotent(key = "order_id, event_type")]
async fn record_payments(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
) -> Result<(), PaymentError> {
    sqlx::query(
        "INSERT INTO payments (order_id, cents) SELECT * FROM unnest($1::text[], $2::bigint[])",
    )
    .bind(
        events
            .iter()
            .map(|e| e.order_id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(events.iter().map(|e| e.amount_cents).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct MailError(#[from] sqlx::Error);

/// A stand-in for a mail provider: records each receipt it sends in `sent_receipts`.
/// One that deduplicates ignores a second request with the same idempotency key, as real
/// providers do.
#[derive(Debug, Clone)]
struct Mailer {
    pool: PgPool,
    deduplicates: bool,
}

impl Mailer {
    async fn send(&self, order_id: &str, key: IdempotencyKey) -> Result<(), MailError> {
        sqlx::query(
            "INSERT INTO sent_receipts (order_id, idempotency_key) VALUES ($1, $2) \
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(order_id)
        .bind(self.deduplicates.then_some(key.as_uuid()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// The README's lease-mode handler, with a lease short enough for tests.
#[idempotent(key = "order_id", mode = "lease", lease = "1s")]
async fn send_receipt(lease: &Lease, event: &OrderEvent, mailer: &Mailer) -> Result<(), MailError> {
    mailer.send(&event.order_id, lease.key()).await?; // the provider deduplicates on the key
    Ok(())
}

fn paid(order_id: &str) -> OrderEvent {
    OrderEvent {
        order_id: order_id.to_owned(),
        event_type: "paid".to_owned(),
        amount_cents: 4200,
    }
}

fn payments() -> Effects {
    Effects::query("SELECT count(*) FROM payments")
}

fn receipts() -> Effects {
    Effects::query("SELECT count(*) FROM sent_receipts")
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_delivered_twice_applies_once(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-twice");
    let receipt =
        testing::assert_idempotent(&idem, &payments(), || apply_payment(&idem, &event)).await;
    assert!(receipt.payment_id > 0);
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_raced_in_one_consumer_applies_once(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-race-one-process");
    let report =
        testing::assert_race_applies_once(&idem, &payments(), 8, |_| apply_payment(&idem, &event))
            .await;
    assert_eq!(report.outcomes.len(), 8);
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_raced_by_consumers_on_several_machines_applies_once(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-race-processes");
    let consumers = testing::processes(&idem, 8);
    let report = testing::assert_race_applies_once(&idem, &payments(), 8, |i| {
        apply_payment(&consumers[i], &event)
    })
    .await;
    assert_eq!(
        report.executed() + report.duplicates() + report.in_progress(),
        8
    );
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_survives_a_connection_lost_before_commit(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-lost-commit");
    let survival = testing::assert_survives(&idem, Fault::FailBeforeCommit, &payments(), || {
        apply_payment(&idem, &event)
    })
    .await;
    assert!(
        matches!(survival.faulty, Err(Error::Database(_))),
        "{survival:?}"
    );
    // A lost connection is not the message's fault: no attempt counted.
    let key = idem_runtime::key::KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .part("event_type", &event.event_type)
        .unwrap()
        .finish();
    let record = idem
        .record("testing_kit::apply_payment", key)
        .await
        .unwrap()
        .expect("the key's row");
    assert_eq!(record.attempts, 1);
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_survives_its_backend_killed_mid_body(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-killed-body");
    let survival = testing::assert_survives(&idem, Fault::KillBackendInBody, &payments(), || {
        apply_payment(&idem, &event)
    })
    .await;
    assert!(survival.faulty.is_err(), "{survival:?}");
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_survives_its_backend_killed_during_commit(pool: PgPool) {
    let idem = testing::idem(pool).await;
    // The kill and the commit race: either may win, and the check holds both ways.
    let (mut executed, mut committed_unseen, mut rolled_back) = (0, 0, 0);
    for n in 0..6 {
        let event = paid(&format!("o-killed-commit-{n}"));
        let survival =
            testing::assert_survives(&idem, Fault::KillBackendDuringCommit, &payments(), || {
                apply_payment(&idem, &event)
            })
            .await;
        match (&survival.faulty, survival.committed_unseen) {
            (Ok(_), _) => executed += 1,
            (Err(_), true) => committed_unseen += 1,
            (Err(_), false) => rolled_back += 1,
        }
    }
    eprintln!(
        "killed during COMMIT: {executed} reported Executed, {committed_unseen} committed \
         unseen, {rolled_back} rolled back"
    );
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_payment_survives_drops_at_every_await_point(pool: PgPool) {
    let idem = &testing::idem(pool).await;
    let drops = testing::assert_survives_drops(idem, &payments(), |n| async move {
        apply_payment(idem, &paid(&format!("o-drop-{n}"))).await
    })
    .await;
    assert!(drops.dropped > 0, "{drops:?}");
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_batch_of_payments_survives_a_lost_batch_commit(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let events = [paid("o-batch")];
    let (idem, events) = (&idem, &events);
    // The batch's commit is lost; its messages are processed again one by one.
    let survival =
        testing::assert_survives(idem, Fault::FailBeforeCommit, &payments(), || async move {
            record_payments(idem, events).await.remove(0)
        })
        .await;
    assert!(
        matches!(survival.faulty, Ok(Outcome::Executed(()))),
        "{survival:?}"
    );
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_receipt_delivered_twice_is_sent_once(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = testing::idem(pool).await;
    let event = paid("o-receipt");
    testing::assert_idempotent(&idem, &receipts(), || send_receipt(&idem, &event, &mailer)).await;
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_receipt_survives_an_abandoned_lease(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = testing::idem(pool).await;
    let event = paid("o-abandoned");
    testing::assert_survives(&idem, Fault::AbandonLease, &receipts(), || {
        send_receipt(&idem, &event, &mailer)
    })
    .await;
}

/// A dropped lease-mode delivery's last statement (the `success`) may land after the check
/// saw the key `processing`: a correct handler passes the sweep all the same, every time.
#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_receipt_survives_drops_at_every_await_point(pool: PgPool) {
    let mailer = &Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = &testing::idem(pool).await;
    for sweep in 0..3 {
        let drops = testing::assert_survives_drops(idem, &receipts(), |n| async move {
            send_receipt(idem, &paid(&format!("o-receipt-drop-{sweep}-{n}")), mailer).await
        })
        .await;
        assert!(drops.dropped > 0, "{drops:?}");
    }
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_receipt_survives_a_worker_vanishing_after_the_effect(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = testing::idem(pool).await;
    let event = paid("o-vanished");
    // The body runs again after the lease expires; the provider absorbs the repeat.
    testing::assert_survives(&idem, Fault::AbandonLeaseAfterBody, &receipts(), || {
        send_receipt(&idem, &event, &mailer)
    })
    .await;
}

// Handlers that are not idempotent, and the checks that catch them.

/// Not idempotent: records a payment on every call.
async fn apply_payment_every_time(
    idem: &Idem,
    event: &OrderEvent,
) -> Handled<Result<Receipt, PaymentError>> {
    let payment_id =
        sqlx::query_scalar("INSERT INTO payments (order_id, cents) VALUES ($1, $2) RETURNING id")
            .bind(&event.order_id)
            .bind(event.amount_cents)
            .fetch_one(idem.pool())
            .await
            .map_err(|error| Error::Handler {
                source: PaymentError(error),
                attempts: 1,
                parked: false,
            })?;
    Ok(Outcome::Executed(Receipt { payment_id }))
}

/// Not idempotent under faults: writes its payment through the pool, outside the
/// transaction that holds its key.
#[idempotent(key = "order_id, event_type")]
async fn apply_payment_outside_the_transaction(
    tx: &mut PgConnection,
    event: &OrderEvent,
    pool: &PgPool,
) -> Result<Receipt, PaymentError> {
    let payment_id =
        sqlx::query_scalar("INSERT INTO payments (order_id, cents) VALUES ($1, $2) RETURNING id")
            .bind(&event.order_id)
            .bind(event.amount_cents)
            .fetch_one(pool)
            .await?;
    // Then it goes on in its transaction: three slower statements after the effect, each
    // a point where the delivery waits.
    for _ in 0..3 {
        sqlx::query("SELECT pg_sleep(0.002)")
            .execute(&mut *tx)
            .await?;
    }
    Ok(Receipt { payment_id })
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "assert_idempotent: delivery 2 of 2")]
async fn assert_idempotent_catches_a_handler_that_applies_every_delivery(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-every-time");
    testing::assert_idempotent(&idem, &payments(), || {
        apply_payment_every_time(&idem, &event)
    })
    .await;
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "expected exactly one execution")]
async fn assert_race_catches_a_handler_that_applies_every_delivery(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-every-racer");
    testing::assert_race_applies_once(&idem, &payments(), 4, |_| {
        apply_payment_every_time(&idem, &event)
    })
    .await;
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "expected exactly one more effect")]
async fn assert_survives_catches_an_effect_written_outside_the_transaction(pool: PgPool) {
    let idem = testing::idem(pool.clone()).await;
    let event = paid("o-outside");
    testing::assert_survives(&idem, Fault::FailBeforeCommit, &payments(), || {
        apply_payment_outside_the_transaction(&idem, &event, &pool)
    })
    .await;
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "expected exactly one more")]
async fn assert_survives_drops_catches_an_effect_written_outside_the_transaction(pool: PgPool) {
    let idem = &testing::idem(pool.clone()).await;
    let pool = &pool;
    // Drop points are sampled: on a loaded machine one sweep can miss the window between
    // the outside write and the commit, so the handler gets a few sweeps.
    for sweep in 0..3 {
        testing::assert_survives_drops(idem, &payments(), |n| async move {
            let event = paid(&format!("o-outside-drop-{sweep}-{n}"));
            apply_payment_outside_the_transaction(idem, &event, pool).await
        })
        .await;
    }
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "expected exactly one more effect")]
async fn assert_survives_catches_a_lease_effect_sent_without_its_key(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: false,
    };
    let idem = testing::idem(pool).await;
    let event = paid("o-no-key");
    testing::assert_survives(&idem, Fault::AbandonLeaseAfterBody, &receipts(), || {
        send_receipt(&idem, &event, &mailer)
    })
    .await;
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "the fault never fired")]
async fn assert_survives_refuses_a_fault_its_delivery_never_reaches(pool: PgPool) {
    let idem = testing::idem(pool).await;
    let event = paid("o-wrong-mode");
    testing::assert_survives(&idem, Fault::AbandonLease, &payments(), || {
        apply_payment(&idem, &event)
    })
    .await;
}

// Handlers whose keys are kept by the fact's time (`event_time`): the kit finds their keys
// in the time buckets as it finds the others' in the status table.

/// An order event that carries its time.
#[derive(Debug, Clone)]
struct TimedOrderEvent {
    order_id: String,
    occurred_at: chrono::DateTime<chrono::Utc>,
}

/// The payment of `order_id` at `occurred_at`: a redelivery carries the same time.
fn paid_at(order_id: &str, occurred_at: chrono::DateTime<chrono::Utc>) -> TimedOrderEvent {
    TimedOrderEvent {
        order_id: order_id.to_owned(),
        occurred_at,
    }
}

/// The lease-mode handler, its keys kept by the fact's time.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    mode = "lease",
    lease = "1s"
)]
async fn send_timed_receipt(
    lease: &Lease,
    event: &TimedOrderEvent,
    mailer: &Mailer,
) -> Result<(), MailError> {
    mailer.send(&event.order_id, lease.key()).await?;
    Ok(())
}

/// The transaction-mode handler, its keys kept by the fact's time.
#[idempotent(key = "order_id, occurred_at", event_time = "occurred_at")]
async fn apply_timed_payment(
    tx: &mut PgConnection,
    event: &TimedOrderEvent,
) -> Result<(), PaymentError> {
    sqlx::query("INSERT INTO payments (order_id, cents) VALUES ($1, 4200)")
        .bind(&event.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_timed_payment_survives_drops_at_every_await_point(pool: PgPool) {
    let idem = &testing::idem(pool).await;
    let at = chrono::Utc::now();
    let drops = testing::assert_survives_drops(idem, &payments(), |n| async move {
        apply_timed_payment(idem, &paid_at(&format!("o-timed-drop-{n}"), at)).await
    })
    .await;
    assert!(drops.dropped > 0, "{drops:?}");
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_timed_receipt_survives_an_abandoned_lease(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = testing::idem(pool).await;
    let event = paid_at("o-timed-abandoned", chrono::Utc::now());
    testing::assert_survives(&idem, Fault::AbandonLease, &receipts(), || {
        send_timed_receipt(&idem, &event, &mailer)
    })
    .await;
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn a_timed_receipt_survives_drops_at_every_await_point(pool: PgPool) {
    let mailer = &Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = &testing::idem(pool).await;
    let at = chrono::Utc::now();
    let drops = testing::assert_survives_drops(idem, &receipts(), |n| async move {
        send_timed_receipt(
            idem,
            &paid_at(&format!("o-timed-receipt-drop-{n}"), at),
            mailer,
        )
        .await
    })
    .await;
    assert!(drops.dropped > 0, "{drops:?}");
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
async fn wait_for_lease_expiry_finds_a_timed_key(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: true,
    };
    let idem = testing::idem(pool).await;
    let event = paid_at("o-timed-expiry", chrono::Utc::now());
    let injection = testing::inject(&idem, Fault::AbandonLease);
    let abandoned = send_timed_receipt(&idem, &event, &mailer).await;
    assert!(injection.disarm(), "the lease was abandoned: {abandoned:?}");
    let key = send_timed_receipt_key(&event).unwrap();
    testing::wait_for_lease_expiry(&idem, key.scope(), key.key()).await;
    let again = send_timed_receipt(&idem, &event, &mailer).await;
    assert!(matches!(again, Ok(Outcome::Executed(()))), "{again:?}");
}

#[sqlx::test(migrations = "tests/testing_kit/migrations")]
#[should_panic(expected = "expected exactly one more effect")]
async fn assert_survives_catches_a_timed_lease_effect_sent_without_its_key(pool: PgPool) {
    let mailer = Mailer {
        pool: pool.clone(),
        deduplicates: false,
    };
    let idem = testing::idem(pool).await;
    let event = paid_at("o-timed-no-key", chrono::Utc::now());
    testing::assert_survives(&idem, Fault::AbandonLeaseAfterBody, &receipts(), || {
        send_timed_receipt(&idem, &event, &mailer)
    })
    .await;
}
