use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
}

// A batch handler's body runs in one database transaction; lease mode has none.
#[idempotent(key = "order_id", mode = "lease")]
async fn notify(events: &[&OrderEvent]) -> Result<(), std::io::Error> {
    let _ = events.iter().map(|e| &e.order_id).count();
    Ok(())
}

fn main() {}
