use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    event_type: String,
}

#[idempotent(key = "order_id, evnet_type")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, &event.event_type);
    Ok(())
}

fn main() {}
