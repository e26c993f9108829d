use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
}

// A batch shares one database transaction; lease-mode bodies have none.
#[idempotent(key = "order_id", mode = "lease", batch = true)]
async fn notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = &event.order_id;
    Ok(())
}

fn main() {}
