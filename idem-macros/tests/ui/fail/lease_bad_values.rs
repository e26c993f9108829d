use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", mode = "leased")]
async fn unknown_mode(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = &event.order_id;
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease", lease = "30 seconds")]
async fn unparsable_lease(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = &event.order_id;
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease", lease = "0s")]
async fn zero_lease(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = &event.order_id;
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease", lease = 30)]
async fn lease_without_unit(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = &event.order_id;
    Ok(())
}

fn main() {}
