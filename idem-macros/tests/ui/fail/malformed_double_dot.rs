use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Order {
    id: String,
}

struct OrderEvent {
    order: Order,
}

#[idempotent(key = "order..id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order.id);
    Ok(())
}

fn main() {}
