use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id")]
async fn apply(event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = &event.order_id;
    Ok(())
}

#[idempotent(key = "order_id")]
async fn apply_nothing() -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
