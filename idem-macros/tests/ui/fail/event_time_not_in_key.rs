use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    occurred_at: DateTime<Utc>,
}

// The fact's time buckets the key, so it must be part of the key: a re-send with another
// time would escape deduplication.
#[idempotent(key = "order_id", event_time = "occurred_at")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, event.occurred_at);
    Ok(())
}

fn main() {}
