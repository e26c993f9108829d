use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    occurred_at: DateTime<Utc>,
    sent_at: DateTime<Utc>,
}

#[idempotent(key = "order_id, occurred_at, sent_at", event_time = "occurred_at, sent_at")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, event.occurred_at, event.sent_at);
    Ok(())
}

fn main() {}
