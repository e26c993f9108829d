//! Each run of the body takes its own clone of the parameters taken by value, so the
//! body may move out of them. A lease-mode body runs once: no `Clone` needed.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
}

#[derive(Clone)]
struct Note(String);

struct NotClone {
    order_id: String,
}

#[idempotent(key = "order_id", batch = true)]
async fn apply(tx: &mut PgConnection, event: OrderEvent, note: Note) -> Result<String, sqlx::Error> {
    let _ = tx;
    let OrderEvent { order_id } = event;
    let Note(text) = note;
    Ok(order_id + &text)
}

#[idempotent(key = "order_id", mode = "lease")]
async fn notify(event: NotClone) -> Result<String, std::io::Error> {
    Ok(event.order_id)
}

async fn deliver(idem: &Idem, event: OrderEvent) {
    let _ = apply_batch(idem, std::slice::from_ref(&event), Note(String::new())).await;
    let _ = apply(idem, event.clone(), Note(String::new())).await;
    let _ = notify(idem, NotClone { order_id: event.order_id }).await;
}

fn main() {
    let _ = deliver;
}
