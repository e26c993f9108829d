use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id")]
async fn apply(log: &mut String, event: &OrderEvent) -> Result<(), std::fmt::Error> {
    log.push_str(&event.order_id);
    Ok(())
}

fn main() {}
