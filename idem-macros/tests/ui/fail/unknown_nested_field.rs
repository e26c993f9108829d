use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Customer {
    id: u64,
}

struct Order {
    id: String,
    customer: Customer,
}

struct OrderEvent {
    order: Order,
}

#[idempotent(key = "order.id, order.customer.number")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order.id, event.order.customer.id);
    Ok(())
}

fn main() {}
