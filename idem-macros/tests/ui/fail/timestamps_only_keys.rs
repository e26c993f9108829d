use chrono::{DateTime, NaiveDateTime, Utc};
use idem_runtime::{KeyPart, idempotent};
use sqlx::PgConnection;

#[derive(KeyPart)]
struct OccurredAt(DateTime<Utc>);

struct OrderEvent {
    order_id: String,
    created_at: DateTime<Utc>,
    updated_at: NaiveDateTime,
    occurred_at: OccurredAt,
    retried_at: Vec<DateTime<Utc>>,
    delivered_at: Option<DateTime<Utc>>,
}

// Every key below is made only of instants: none identifies a business fact.
#[idempotent(key = "occurred_at")]
async fn newtype(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(key = "retried_at")]
async fn list(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "created_at, updated_at")]
async fn two(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key(delivered_at, created_at))]
async fn optional(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "created_at")]
async fn batch(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events);
    Ok(())
}

fn main() {}
