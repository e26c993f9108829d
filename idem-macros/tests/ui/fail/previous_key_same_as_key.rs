use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", previous_key(order_id))]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

fn main() {}
