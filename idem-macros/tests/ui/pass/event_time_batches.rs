use std::time::SystemTime;

use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
    occurred_at: DateTime<Utc>,
    sent_at: SystemTime,
}

// The batch variant of a handler of one message, its keys kept by the fact's time.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    batch = true
)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    let _ = (tx, event.sent_at);
    Ok(event.order_id.clone())
}

// A batch handler whose keys are kept by the fact's time, sharing its scope with the
// handler of one message below.
#[idempotent(key = "order_id, sent_at", event_time = "sent_at", scope = "sent")]
async fn apply_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events.len());
    Ok(())
}

#[idempotent(key = "order_id, sent_at", event_time = "sent_at", scope = "sent")]
async fn apply_one(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.occurred_at);
    Ok(())
}

fn main() {
    let event = OrderEvent {
        order_id: "o-1".into(),
        occurred_at: Utc::now(),
        sent_at: SystemTime::now(),
    };
    assert!(apply_key(&event).unwrap().fact_time().is_some());
    let _ = (apply_batch, apply_all, apply_one);
}
