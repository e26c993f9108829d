//! The default scope of every handler shape, pinned: a key is claimed once per `(scope,
//! key)`, so a release that derived another default scope for the same handler would run
//! every redelivered fact again. A change to this table is a change of the stored format:
//! it needs a migration path for the scopes recorded under the old names, not a new
//! expectation here.
use idem_runtime::{Idem, idempotent, lease::Lease};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(key = "order_id")]
async fn r#type(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(key = "order_id")]
async fn generic<E: Send + Sync>(
    tx: &mut PgConnection,
    event: &OrderEvent,
    extra: &E,
) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, extra);
    Ok(())
}

#[idempotent(key = "order_id", batch = true)]
async fn with_batch(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(key = "order_id")]
async fn record_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events.len());
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease")]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = (lease, &event.order_id);
    Ok(())
}

mod billing {
    use super::*;

    pub struct Ledger;

    impl Ledger {
        #[idempotent(key = "order_id")]
        pub async fn book(
            &self,
            tx: &mut PgConnection,
            event: &OrderEvent,
        ) -> Result<(), sqlx::Error> {
            let _ = (tx, &event.order_id);
            Ok(())
        }

        #[idempotent(key = "order_id")]
        pub async fn settle(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
            let _ = (tx, &event.order_id);
            Ok(())
        }
    }

    pub struct Typed<T>(pub std::marker::PhantomData<T>);

    impl<T: Sync> Typed<T> {
        #[idempotent(key = "order_id")]
        pub async fn apply(
            &self,
            tx: &mut PgConnection,
            event: &OrderEvent,
        ) -> Result<(), sqlx::Error> {
            let _ = (tx, &event.order_id, &self.0);
            Ok(())
        }
    }

    pub mod nested {
        use super::*;

        #[idempotent(key = "order_id")]
        pub async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
            let _ = (tx, &event.order_id);
            Ok(())
        }
    }
}

#[test]
fn default_scopes_are_pinned() {
    let event = OrderEvent {
        order_id: "o-1".to_owned(),
    };
    let scopes = [
        ("free function", apply_key(&event).unwrap().scope()),
        ("raw identifier", type_key(&event).unwrap().scope()),
        ("generic function", generic_key(&event).unwrap().scope()),
        ("batch = true", with_batch_key(&event).unwrap().scope()),
        ("batch handler", record_all_key(&event).unwrap().scope()),
        ("lease mode", notify_key(&event).unwrap().scope()),
        ("method", billing::Ledger::book_key(&event).unwrap().scope()),
        (
            "associated function",
            billing::Ledger::settle_key(&event).unwrap().scope(),
        ),
        (
            "method of a generic impl",
            billing::Typed::<u8>::apply_key(&event).unwrap().scope(),
        ),
        (
            "nested module",
            billing::nested::apply_key(&event).unwrap().scope(),
        ),
    ];
    let pinned = [
        ("free function", "default_scopes::apply"),
        ("raw identifier", "default_scopes::type"),
        ("generic function", "default_scopes::generic"),
        ("batch = true", "default_scopes::with_batch"),
        ("batch handler", "default_scopes::record_all"),
        ("lease mode", "default_scopes::notify"),
        ("method", "default_scopes::billing::book"),
        ("associated function", "default_scopes::billing::settle"),
        ("method of a generic impl", "default_scopes::billing::apply"),
        ("nested module", "default_scopes::billing::nested::apply"),
    ];
    assert_eq!(scopes, pinned);
}

/// The handlers are called only through their key functions here; this keeps them used.
#[allow(dead_code)]
async fn deliver(idem: &Idem, event: &OrderEvent) {
    let _ = apply(idem, event).await;
    let _ = r#type(idem, event).await;
    let _ = generic(idem, event, &1u8).await;
    let _ = with_batch(idem, event).await;
    let _ = with_batch_batch(idem, std::slice::from_ref(event)).await;
    let _ = record_all(idem, std::slice::from_ref(event)).await;
    let _ = notify(idem, event).await;
    let _ = billing::Ledger.book(idem, event).await;
    let _ = billing::Ledger::settle(idem, event).await;
    let _ = billing::Typed::<u8>(std::marker::PhantomData)
        .apply(idem, event)
        .await;
    let _ = billing::nested::apply(idem, event).await;
}
