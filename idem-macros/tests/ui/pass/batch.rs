//! `batch = true` generates `<handler>_batch` over a slice, for borrowed and owned messages.
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", batch = true)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<usize, sqlx::Error> {
    let _ = tx;
    Ok(event.order_id.len())
}

#[idempotent(key = "order_id", batch = true)]
async fn apply_owned(tx: &mut PgConnection, event: OrderEvent, topic: String) -> Result<(), sqlx::Error> {
    let _ = tx;
    let _moved: (String, String) = (event.order_id, topic);
    Ok(())
}

async fn consume(idem: Idem, events: Vec<OrderEvent>) {
    let task = tokio::spawn(async move {
        let outcomes = apply_batch(&idem, &events).await;
        let _: Vec<Option<usize>> = outcomes.into_iter().map(|o| o.ok().and_then(Outcome::into_value)).collect();
        apply_owned_batch(&idem, &events, "orders".to_owned()).await.len()
    });
    let _ = task.await;
}

fn main() {
    let _ = consume;
}
