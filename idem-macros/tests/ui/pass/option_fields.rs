//! `Option` fields may be key parts (`None` is a key error at run time, never a key).
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::PgConnection;
use uuid::Uuid;

struct Customer {
    id: Option<u64>,
}

struct OrderEvent {
    order_id: Option<String>,
    event_key: Option<Uuid>,
    customer: Customer,
}

#[idempotent(key = "order_id, customer.id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

// An `Option` alone is a key too (a producer-stamped key that may be absent).
#[idempotent(key = "event_key")]
async fn apply_stamped(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let first: Result<Outcome<()>, Error<sqlx::Error>> = apply(idem, event).await;
    if let Err(Error::Key(error)) = first {
        let _ = error.to_string();
    }
    let _ = apply_stamped(idem, event).await;
}

fn main() {
    let _ = deliver;
}
