use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id")]
async fn apply(
    tx: &mut PgConnection,
    OrderEvent { order_id }: &OrderEvent,
) -> Result<(), sqlx::Error> {
    let _ = (tx, order_id);
    Ok(())
}

fn main() {}
