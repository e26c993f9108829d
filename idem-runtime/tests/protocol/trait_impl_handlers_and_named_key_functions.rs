//! A handler may implement a trait method (the trait declares the rewritten signature,
//! and the handler sets `key_fn = false`: the trait declares no key function): reached
//! through the trait, it executes once and answers the redelivery as a duplicate. Every
//! impl of the method in one module has the same default scope (the module path and the
//! method's name), so a second impl needs a `scope` of its own, or its first run is a
//! `ScopeConflict`. A key function named with `key_fn = "name"` gives the row its
//! handler stored.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::{Error, Handled, HandlerKey, Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

trait Apply {
    async fn apply(&self, idem: &Idem, event: &OrderEvent) -> Handled<Result<i64, sqlx::Error>>;
}

struct Payments;

impl Apply for Payments {
    #[idempotent(key = "order_id, event_type", key_fn = false)]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
        testing::insert_effect(tx, event).await
    }
}

/// Another impl in the module, with its own scope.
struct Refunds;

impl Apply for Refunds {
    #[idempotent(key = "order_id, event_type", scope = "refunds", key_fn = false)]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
        testing::insert_effect(tx, event).await
    }
}

/// Another impl in the module with the default scope: the one `Payments` owns.
struct Chargebacks;

impl Apply for Chargebacks {
    #[idempotent(key = "order_id, event_type", key_fn = false)]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
        testing::insert_effect(tx, event).await
    }
}

/// A consumer that knows the handler only by its trait.
async fn consume<H: Apply>(
    handler: &H,
    idem: &Idem,
    event: &OrderEvent,
) -> Handled<Result<i64, sqlx::Error>> {
    handler.apply(idem, event).await
}

/// The user's own `ledger_key`, next to the handler `ledger`.
fn ledger_key(event: &OrderEvent) -> String {
    format!("ledger:{}", event.order_id)
}

#[idempotent(key = "order_id", scope = "ledger", key_fn = "ledger_entry_key")]
async fn ledger(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    testing::insert_effect(tx, event).await.map(drop)
}

/// Every `(scope, key)` of the status table, in order.
async fn stored(pool: &PgPool) -> Vec<(String, Uuid)> {
    sqlx::query_as("SELECT scope, key FROM idem.idem_keys ORDER BY scope, key")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_trait_impl_handler_executes_once_through_the_trait(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-trait", 300);

    let first = consume(&Payments, &idem, &event).await.unwrap();
    let Outcome::Executed(id) = first else {
        panic!("{first:?}")
    };
    let again = consume(&Payments, &idem, &event).await.unwrap();
    assert!(
        matches!(again, Outcome::Duplicate(Some(replayed)) if replayed == id),
        "{again:?}"
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 1);

    // Its own scope: the same message is new to `Refunds`.
    assert!(
        consume(&Refunds, &idem, &event)
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 2);
    let scopes: Vec<String> = stored(&pool)
        .await
        .into_iter()
        .map(|(scope, _)| scope)
        .collect();
    assert_eq!(scopes, [concat!(module_path!(), "::apply"), "refunds"]);

    // The default scope of `Chargebacks::apply` is that of `Payments::apply`.
    let error = consume(&Chargebacks, &idem, &event).await.unwrap_err();
    assert!(matches!(error, Error::ScopeConflict(_)), "{error:?}");
    assert_eq!(testing::count_rows(&pool, "order_effects").await, 2);
}

#[sqlx::test(migrations = false)]
async fn a_named_key_function_gives_the_stored_row(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-named", 100);

    assert!(ledger(&idem, &event).await.unwrap().is_executed());
    let key: HandlerKey = ledger_entry_key(&event).unwrap();
    assert_eq!(
        stored(&pool).await,
        [(key.scope().to_owned(), key.key().as_uuid())]
    );
    assert_eq!(key.scope(), "ledger");
    assert_eq!(ledger_key(&event), "ledger:o-named");
}
