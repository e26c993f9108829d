use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
    event_id: u64,
}

// A lease is committed on its own: the keys of two definitions cannot be claimed together.
#[idempotent(key = "event_id", previous_key = "order_id", mode = "lease")]
async fn notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = (&event.order_id, event.event_id);
    Ok(())
}

fn main() {}
