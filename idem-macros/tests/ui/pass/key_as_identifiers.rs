//! `key(...)` and `fingerprint(...)` take the fields as identifiers, so that renaming a
//! field renames it in the attribute too; paths and tuple fields work as in the string.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct Customer {
    id: u64,
}

struct Pair(String, (u32, u64));

struct OrderEvent {
    order_id: String,
    event_type: String,
    customer: Customer,
    amount_cents: i64,
    pair: Pair,
}

#[idempotent(key(order_id, event_type), fingerprint(amount_cents, customer.id))]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key(pair.0, pair.1.1), batch = true)]
async fn by_pair(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(key = "pair.0, pair.1.0", fingerprint = "customer.id")]
async fn by_pair_string(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key(order_id), mode = "lease")]
async fn notify(event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = event;
    Ok(())
}

#[idempotent(key(order_id, event_type))]
async fn record(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events);
    Ok(())
}

async fn deliver(idem: &Idem, events: &[OrderEvent]) {
    let _ = apply(idem, &events[0]).await;
    let _ = by_pair(idem, &events[0]).await;
    let _ = by_pair_batch(idem, events).await;
    let _ = by_pair_string(idem, &events[0]).await;
    let _ = notify(idem, &events[0]).await;
    let _ = record(idem, events).await;
}

fn main() {
    let _ = deliver;
}
