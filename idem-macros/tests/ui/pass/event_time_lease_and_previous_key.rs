use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use idem_runtime::lease::Lease;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    event_id: u64,
    occurred_at: DateTime<Utc>,
}

// Lease mode with keys kept by the fact's time.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    mode = "lease",
    lease = "30s"
)]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = (lease.token(), &event.order_id, event.event_id);
    Ok(())
}

// The keys move from the status table into the time buckets: the same fields.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id, occurred_at",
    scope = "moved"
)]
async fn moved(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

// A new key for keys kept by the fact's time, whose previous keys were kept by it too.
#[idempotent(
    key = "event_id, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id, occurred_at",
    previous_event_time = "occurred_at",
    scope = "rekeyed"
)]
async fn rekeyed(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

fn main() {
    let event = OrderEvent {
        order_id: "o-1".into(),
        event_id: 7,
        occurred_at: Utc::now(),
    };
    let key = rekeyed_key(&event).unwrap();
    assert_eq!(key.fact_time().map(|at| at.timestamp()), Some(event.occurred_at.timestamp()));
    assert!(key.previous_key().is_some());
    let moved = moved_key(&event).unwrap();
    assert_eq!(moved.previous_key(), Some(moved.key()));
    let _ = notify_key(&event).unwrap();
}
