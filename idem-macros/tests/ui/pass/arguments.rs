//! `fingerprint`, `scope`, `max_attempts` and `store_result` in any order.
use chrono::{DateTime, Utc};
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    event_type: String,
    amount_cents: i64,
    occurred_at: DateTime<Utc>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(
    key = "order_id, event_type, occurred_at",
    fingerprint = "amount_cents",
    scope = "payments.apply.v2",
    max_attempts = 3,
    store_result = true
)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(Receipt {
        payment_id: event.amount_cents,
    })
}

#[idempotent(max_attempts = 1, scope = "once", key = "order_id")]
async fn once(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    if let Ok(outcome) = apply(idem, event).await {
        let _ = outcome.into_value().map(|receipt| receipt.payment_id);
    }
    let _ = once(idem, event).await;
}

fn main() {
    let _ = deliver;
}
