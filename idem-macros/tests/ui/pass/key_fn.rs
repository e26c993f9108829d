//! Next to every handler, `<handler>_key(&message)` gives the key the handler derives
//! (scope, idempotency key, payload fingerprint), wherever the handler is written: a free
//! function, a function inside a function body, a method or an associated function of
//! an `impl` (generic or not), a handler generic over something else than the message, a
//! batch handler (whose key function takes one message), a lease-mode handler, a handler
//! that takes its message by value, and a raw identifier. `main` runs: the keys are
//! computed, compared with `KeyBuilder`'s, and a `None` key field is a `KeyError`.
use std::marker::PhantomData;

use idem_runtime::key::KeyBuilder;
use idem_runtime::{HandlerKey, KeyError, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
    event_type: String,
    amount_cents: i64,
    coupon: Option<String>,
}

#[idempotent(key = "order_id, event_type", fingerprint = "amount_cents, coupon")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "order_id, coupon", scope = "coupons")]
pub async fn redeem(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "order_id", scope = "batch")]
async fn record(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events);
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease", scope = "notify")]
async fn notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = event;
    Ok(())
}

#[idempotent(key = "order_id", scope = "owned")]
async fn owned(tx: &mut PgConnection, event: OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "order_id", scope = "keyword")]
async fn r#type(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

trait Ledger {
    const NAME: &'static str;
}
struct Cash;
impl Ledger for Cash {
    const NAME: &'static str = "cash";
}

/// Generic over the ledger and the error: the key function is generic over neither.
#[idempotent(key = "order_id", scope = "book")]
async fn book<'a, L: Ledger, E>(tx: &mut PgConnection, event: &'a OrderEvent) -> Result<String, E>
where
    E: std::error::Error + From<sqlx::Error> + Send + 'static,
{
    let _ = (tx, event);
    Ok(L::NAME.to_owned())
}

struct Tagged<T> {
    order_id: String,
    tag: T,
}

/// Generic over the message: so is the key function.
#[idempotent(key = "order_id", scope = "wrapped")]
async fn wrapped<T: Sync>(tx: &mut PgConnection, event: &Tagged<T>) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.tag);
    Ok(())
}

/// A `#[cfg]` after the attribute removes the handler before it is expanded, and so its key
/// function with it: `Gone` does not exist.
#[idempotent(key = "order_id", scope = "gone")]
#[cfg(any())]
async fn gone(tx: &mut PgConnection, event: &Gone) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

struct Payments;

impl Payments {
    #[idempotent(key = "order_id", scope = "payments")]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, event);
        Ok(())
    }

    #[idempotent(key = "order_id")]
    pub async fn handle(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, event);
        Ok(())
    }
}

struct Typed<T>(PhantomData<T>);

impl<T: Sync> Typed<T> {
    #[idempotent(key = "order_id", scope = "typed")]
    async fn apply(&self, tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, event, &self.0);
        Ok(())
    }
}

fn key_of(order_id: &str) -> idem_runtime::IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .unwrap()
        .finish()
}

fn main() {
    let event = OrderEvent {
        order_id: "order-1".to_owned(),
        event_type: "paid".to_owned(),
        amount_cents: 100,
        coupon: None,
    };

    // The default scope is the handler's module path and name.
    let key: HandlerKey = apply_key(&event).unwrap();
    assert_eq!(key.scope(), concat!(module_path!(), "::apply"));
    assert_eq!(
        key.key(),
        KeyBuilder::new()
            .part("order_id", "order-1")
            .unwrap()
            .part("event_type", "paid")
            .unwrap()
            .finish()
    );
    // `None` is a value of a fingerprint.
    let fingerprint = KeyBuilder::fingerprint()
        .part("amount_cents", &100_i64)
        .unwrap()
        .part("coupon", &None::<String>)
        .unwrap()
        .digest();
    assert_eq!(key.fingerprint(), Some(fingerprint));
    assert!(!key.fingerprint_differs(Some(&fingerprint)));
    let other = apply_key(&OrderEvent {
        amount_cents: 200,
        ..event.clone()
    })
    .unwrap();
    assert_eq!(other.key(), key.key());
    assert!(other.fingerprint_differs(Some(&fingerprint)));
    assert!(!other.fingerprint_differs(None));

    // ... and of a key, an error.
    assert_eq!(
        redeem_key(&event),
        Err(KeyError::MissingValue { field: "coupon" })
    );

    for (key, scope) in [
        (record_key(&event), "batch"),
        (notify_key(&event), "notify"),
        (owned_key(&event), "owned"),
        (type_key(&event), "keyword"),
        (book_key(&event), "book"),
        (Payments::apply_key(&event), "payments"),
        (Typed::<u8>::apply_key(&event), "typed"),
    ] {
        let key = key.unwrap();
        assert_eq!(
            (key.scope(), key.key(), key.fingerprint()),
            (scope, key_of("order-1"), None)
        );
    }
    assert_eq!(
        Payments::handle_key(&event).unwrap().scope(),
        concat!(module_path!(), "::handle")
    );
    let tagged = Tagged {
        order_id: "order-1".to_owned(),
        tag: 7_u8,
    };
    assert_eq!(wrapped_key(&tagged).unwrap().key(), key_of("order-1"));

    // Handlers inside a function body have their key function there too.
    #[idempotent(key = "event_type", scope = "inner")]
    async fn inner(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
        let _ = (tx, event);
        Ok(())
    }
    assert_eq!(inner_key(&event).unwrap().scope(), "inner");
    let _ = (
        apply,
        redeem,
        record,
        notify,
        owned,
        r#type,
        book::<Cash, sqlx::Error>,
        wrapped::<u8>,
        inner,
    );
}
