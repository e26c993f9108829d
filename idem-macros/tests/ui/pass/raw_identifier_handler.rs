//! A handler named with a raw identifier keeps working: `r#type` generates `type_batch`
//! (and its default scope ends in `::type`).
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", batch = true)]
async fn r#type(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(key = "order_id", mode = "lease")]
async fn r#match(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = &event.order_id;
    Ok(())
}

async fn deliver(idem: &Idem, events: &[OrderEvent]) {
    let _ = r#type(idem, &events[0]).await;
    let _ = type_batch(idem, events).await;
    let _ = r#match(idem, &events[0]).await;
}

fn main() {
    let _ = deliver;
}
