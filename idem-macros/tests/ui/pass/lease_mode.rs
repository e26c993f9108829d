//! Lease-mode handlers: with or without the lease guard, owned or borrowed messages,
//! spawned from an async fn.
use idem_runtime::lease::Lease;
use idem_runtime::{Idem, idempotent};

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", mode = "lease", lease = "1500ms", max_attempts = 3)]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<String, std::io::Error> {
    lease
        .extend(std::time::Duration::from_secs(10))
        .await
        .map_err(std::io::Error::other)?;
    Ok(format!("{} {}", event.order_id, lease.token()))
}

#[idempotent(key = "order_id", mode = "lease", store_result = false)]
async fn notify_owned(event: OrderEvent) -> Result<(), std::io::Error> {
    drop(event.order_id);
    Ok(())
}

async fn consume(idem: Idem, event: OrderEvent) {
    let task = tokio::spawn(async move {
        let _ = notify(&idem, &event).await;
        notify_owned(&idem, event).await.is_ok()
    });
    let _ = task.await;
}

fn main() {
    let _ = consume;
}
