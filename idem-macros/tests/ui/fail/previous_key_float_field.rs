use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    amount: f64,
}

#[idempotent(key = "order_id", previous_key = "amount")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, event.amount);
    Ok(())
}

fn main() {}
