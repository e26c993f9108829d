use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

struct Receipt {
    payment_id: i64,
}

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(Receipt { payment_id: 1 })
}

fn main() {}
