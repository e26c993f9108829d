//! `previous_key` on every transaction-mode shape: a handler of one message (borrowed or
//! owned), its `batch = true` variant, a batch handler, an optional old field; the key
//! function gives the previous key too.
use idem_runtime::{HandlerKey, Idem, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    event_id: uuid::Uuid,
    order_id: Option<String>,
    event_type: String,
}

#[idempotent(key = "event_id", previous_key = "order_id, event_type", batch = true)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event.event_id);
    Ok(())
}

#[idempotent(key(event_id), previous_key(order_id), scope = "owned")]
async fn apply_owned(tx: &mut PgConnection, event: OrderEvent) -> Result<u64, sqlx::Error> {
    let _ = (tx, event);
    Ok(1)
}

#[idempotent(key = "event_id", previous_key = "order_id, event_type")]
async fn apply_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events.len());
    Ok(())
}

async fn deliver(idem: &Idem, event: OrderEvent) {
    let _ = apply(idem, &event).await;
    let _ = apply_batch(idem, std::slice::from_ref(&event)).await;
    let _ = apply_all(idem, std::slice::from_ref(&event)).await;
    let _ = apply_owned(idem, event.clone()).await;
    let key: HandlerKey = apply_key(&event).unwrap();
    let _ = key.previous_key();
}

fn main() {
    let _ = deliver;
}
