use idem_runtime::idempotent;
use idem_runtime::lease::Lease;

struct OrderEvent {
    order_id: String,
}

// The lease guard is only given to lease-mode handlers.
#[idempotent(key = "order_id")]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = (lease.token(), &event.order_id);
    Ok(())
}

fn main() {}
