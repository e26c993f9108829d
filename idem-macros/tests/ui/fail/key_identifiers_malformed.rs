use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key(order-id))]
async fn dashed(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key())]
async fn empty(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key(order_id, "event_type"))]
async fn quoted(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

fn main() {}
