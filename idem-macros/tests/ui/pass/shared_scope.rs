//! `shared_scope = true` declares a scope that several handlers use on purpose: a batch
//! handler and the handler of one message over the same keys.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", scope = "orders", shared_scope = true)]
async fn record(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(key = "order_id", scope = "orders", shared_scope = true)]
async fn record_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events);
    Ok(())
}

// `false` is the default, and needs no scope.
#[idempotent(key = "order_id", shared_scope = false)]
async fn alone(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

async fn deliver(idem: &Idem, events: &[OrderEvent]) {
    let _ = record(idem, &events[0]).await;
    let _ = record_all(idem, events).await;
    let _ = alone(idem, &events[0]).await;
}

fn main() {
    let _ = deliver;
}
