use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

struct Limits {
    max_cents: i64,
}

// The body may run again after a serialization failure or a deadlock, on a fresh clone
// of what it takes by value: those types must be `Clone`.
#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: OrderEvent, limits: Limits) -> Result<(), sqlx::Error> {
    let _ = (tx, event.order_id, limits.max_cents);
    Ok(())
}

// `batch = true` borrows the messages from a slice: a message taken by value is cloned.
#[idempotent(key = "order_id", batch = true)]
async fn apply_each(tx: &mut PgConnection, event: OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event.order_id);
    Ok(())
}

fn main() {}
