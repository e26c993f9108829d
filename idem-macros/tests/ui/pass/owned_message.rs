//! The message may be taken by reference, by value or through a smart pointer.
use std::sync::Arc;

use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
    amount_cents: i64,
}

#[idempotent(key = "order_id")]
async fn by_reference(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    let _ = tx;
    Ok(event.amount_cents)
}

#[idempotent(key = "order_id")]
async fn by_value(tx: &mut PgConnection, event: OrderEvent) -> Result<i64, sqlx::Error> {
    let _ = tx;
    Ok(event.amount_cents)
}

#[idempotent(key = "order_id")]
async fn by_arc(tx: &mut PgConnection, event: Arc<OrderEvent>) -> Result<i64, sqlx::Error> {
    let _ = tx;
    Ok(event.amount_cents)
}

#[idempotent(key = "order_id")]
async fn by_box(tx: &mut PgConnection, event: Box<OrderEvent>) -> Result<String, sqlx::Error> {
    let _ = tx;
    Ok(event.order_id.clone())
}

async fn deliver(idem: &Idem, event: OrderEvent) {
    let _ = by_reference(idem, &event).await;
    let _ = by_arc(idem, Arc::new(event.clone())).await;
    let _ = by_box(idem, Box::new(event.clone())).await;
    let _ = by_value(idem, event).await;
}

fn main() {
    let _ = deliver;
}
