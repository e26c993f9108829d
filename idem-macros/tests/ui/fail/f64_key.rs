use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Payment {
    order_id: String,
    amount: f64,
}

#[idempotent(key = "order_id, amount")]
async fn pay(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, &payment.order_id);
    Ok(())
}

fn main() {}
