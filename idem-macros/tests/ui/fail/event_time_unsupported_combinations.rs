use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    occurred_at: DateTime<Utc>,
}

#[idempotent(key = "order_id, occurred_at", event_time = "occurred_at", mode = "lease")]
async fn notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = (&event.order_id, event.occurred_at);
    Ok(())
}

#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id"
)]
async fn apply_again(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, event.occurred_at);
    Ok(())
}

fn main() {}
