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

struct Reading {
    id: String,
    at: DateTime<Utc>,
}

// A short name is not "meant" as another short name of the key: no suggestion of `id`.
#[idempotent(key = "id", event_time = "at")]
async fn record(tx: &mut PgConnection, reading: &Reading) -> Result<(), sqlx::Error> {
    let _ = (tx, &reading.id, reading.at);
    Ok(())
}

fn main() {}
