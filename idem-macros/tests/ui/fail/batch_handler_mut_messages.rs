use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id")]
async fn record_orders(tx: &mut PgConnection, events: &[&mut OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events.iter().map(|e| &e.order_id).count());
    Ok(())
}

fn main() {}
