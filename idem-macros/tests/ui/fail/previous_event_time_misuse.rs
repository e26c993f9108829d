use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    event_id: u64,
    occurred_at: DateTime<Utc>,
    sent_at: DateTime<Utc>,
}

// Without `previous_key`: no previous keys to locate.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    previous_event_time = "occurred_at",
    scope = "a"
)]
async fn without_previous_key(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

// Without `event_time`: keys move into the time buckets, not out of them.
#[idempotent(
    key = "event_id, occurred_at",
    previous_key = "order_id, occurred_at",
    previous_event_time = "occurred_at",
    scope = "b"
)]
async fn out_of_the_buckets(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

// Not one of the previous key's fields.
#[idempotent(
    key = "event_id, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id",
    previous_event_time = "occurred_at",
    scope = "c"
)]
async fn not_in_previous_key(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

// Another field than `event_time`'s.
#[idempotent(
    key = "event_id, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id, sent_at",
    previous_event_time = "sent_at",
    scope = "d"
)]
async fn another_time(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

// The same definition as the current one.
#[idempotent(
    key = "order_id, occurred_at",
    event_time = "occurred_at",
    previous_key = "order_id, occurred_at",
    previous_event_time = "occurred_at",
    scope = "e"
)]
async fn same_definition(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

fn main() {}
