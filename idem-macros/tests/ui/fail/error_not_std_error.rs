use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), String> {
    let _ = tx;
    if event.order_id.is_empty() {
        return Err("empty order id".to_owned());
    }
    Ok(())
}

// Reported once for the handler and its batch variant.
#[idempotent(key = "order_id", batch = true)]
async fn apply_batched(tx: &mut PgConnection, event: &OrderEvent) -> Result<u32, &'static str> {
    let _ = (tx, &event.order_id);
    Ok(1)
}

#[idempotent(key = "order_id", mode = "lease")]
async fn notify(event: &OrderEvent) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _ = &event.order_id;
    Ok(())
}

fn main() {}
