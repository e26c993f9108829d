use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Receipt {
    let _ = (tx, &event.order_id);
    Receipt { payment_id: 1 }
}

fn main() {}
