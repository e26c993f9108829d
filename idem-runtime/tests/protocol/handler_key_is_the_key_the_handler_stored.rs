//! `<handler>_key(&message)` gives the row a delivery of the message claims: the scope,
//! key and fingerprint that the handler stored in `idem.idem_keys`, for a handler of one
//! message, a method of a generic `impl` and a batch handler; its fingerprint check
//! agrees with the handler's (`PayloadMismatch` exactly when it says the fingerprints
//! differ); and a key field that is `None` is a `KeyError`, as the handler's
//! `Error::Key`.
use std::collections::BTreeSet;
use std::marker::PhantomData;

use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Error, HandlerKey, KeyError, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[idempotent(key = "order_id, event_type", fingerprint = "amount_cents")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    testing::insert_effect(tx, event).await
}

/// A handler in a generic `impl`, with the default scope.
struct Ledger<T>(PhantomData<T>);

impl<T: Sync> Ledger<T> {
    #[idempotent(key = "order_id", fingerprint = "amount_cents, event_key")]
    async fn book(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        testing::insert_effect(tx, event).await.map(drop)
    }
}

#[idempotent(key = "order_id", fingerprint = "amount_cents", scope = "recorded")]
async fn record(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    for event in events {
        testing::insert_effect(tx, event).await?;
    }
    Ok(())
}

/// Keyed on the producer's key, which a message may lack.
#[idempotent(key = "event_key", scope = "stamped")]
async fn stamped(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(drop)
}

/// Every `(scope, key, fingerprint)` of the status table.
async fn stored(pool: &PgPool) -> BTreeSet<(String, Uuid, Option<Vec<u8>>)> {
    sqlx::query_as("SELECT scope, key, fingerprint FROM idem.idem_keys")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

fn row(key: HandlerKey) -> (String, Uuid, Option<Vec<u8>>) {
    (
        key.scope().to_owned(),
        key.key().as_uuid(),
        key.fingerprint().map(Vec::from),
    )
}

#[sqlx::test(migrations = false)]
async fn the_key_function_gives_the_stored_row_and_agrees_on_the_fingerprint(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-key", 500);
    let ledger = Ledger::<u8>(PhantomData);
    let batch = [testing::paid("o-batch-1", 1), testing::paid("o-batch-2", 2)];

    assert!(pay(&idem, &event).await.unwrap().is_executed());
    ledger.book(&idem, &event).await.unwrap();
    for outcome in record(&idem, &batch).await {
        assert!(outcome.unwrap().is_executed());
    }

    let expected: BTreeSet<_> = [
        pay_key(&event),
        Ledger::<u8>::book_key(&event),
        record_key(&batch[0]),
        record_key(&batch[1]),
    ]
    .into_iter()
    .map(|key| row(key.unwrap()))
    .collect();
    assert_eq!(stored(&pool).await, expected);
    // The default scope names the method by its module path and name.
    assert_eq!(
        Ledger::<u8>::book_key(&event).unwrap().scope(),
        concat!(module_path!(), "::book")
    );

    // The same payload: the fingerprints agree, and the delivery is a duplicate. The
    // recorded fingerprint as `Idem::record` reads it back.
    let same = pay_key(&event).unwrap();
    let recorded = idem
        .record(same.scope(), same.key())
        .await
        .unwrap()
        .expect("the key is recorded")
        .fingerprint
        .expect("the handler declares fingerprint fields");
    assert_eq!(
        Some(recorded.as_slice()),
        same.fingerprint().as_ref().map(|f| f.as_slice())
    );
    assert!(!same.fingerprint_differs(Some(&recorded)));
    assert!(matches!(
        pay(&idem, &event).await.unwrap(),
        Outcome::Duplicate(Some(_))
    ));

    // Another amount: the key is the same, the fingerprints differ, and the handler
    // refuses the payload for that key.
    let altered = OrderEvent {
        amount_cents: 501,
        ..event.clone()
    };
    let other = pay_key(&altered).unwrap();
    assert_eq!(other.key(), same.key());
    assert!(other.fingerprint_differs(Some(&recorded)));
    let error = pay(&idem, &altered).await.unwrap_err();
    assert!(
        matches!(error, Error::PayloadMismatch { key } if key == other.key()),
        "{error:?}"
    );

    // `None` is a value of a fingerprint (the ledger's `event_key`): a producer's key on
    // the redelivery is another payload.
    let with_key = OrderEvent {
        event_key: Some(Uuid::nil()),
        ..event.clone()
    };
    let book_recorded = Ledger::<u8>::book_key(&event)
        .unwrap()
        .fingerprint()
        .unwrap();
    assert!(
        Ledger::<u8>::book_key(&with_key)
            .unwrap()
            .fingerprint_differs(Some(&book_recorded))
    );
    assert!(matches!(
        ledger.book(&idem, &with_key).await,
        Err(Error::PayloadMismatch { .. })
    ));
}

#[sqlx::test(migrations = false)]
async fn a_key_field_that_is_none_is_a_key_error(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-unstamped", 100);
    assert_eq!(event.event_key, None);

    assert_eq!(
        stamped_key(&event),
        Err(KeyError::MissingValue { field: "event_key" })
    );
    assert!(matches!(
        stamped(&idem, &event).await,
        Err(Error::Key(KeyError::MissingValue { field: "event_key" }))
    ));
    assert!(stored(&pool).await.is_empty());

    let stamped_event = OrderEvent {
        event_key: Some(Uuid::from_u128(7)),
        ..event
    };
    stamped(&idem, &stamped_event).await.unwrap();
    assert_eq!(
        stored(&pool).await,
        BTreeSet::from([row(stamped_key(&stamped_event).unwrap())])
    );
}
