use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

// The key fields are checked on the message type of the slice.
#[idempotent(key = "order_id, event_type")]
async fn record_orders(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events.iter().map(|e| &e.order_id).count());
    Ok(())
}

fn main() {}
