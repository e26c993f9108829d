//! Key and fingerprint fields may be nested paths into the message.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct Customer {
    id: u64,
}

struct Order {
    id: String,
    customer: Customer,
}

struct OrderPlaced {
    order: Order,
    amount_cents: i64,
}

#[idempotent(
    key = "order.customer.id, order.id",
    fingerprint = "amount_cents, order.customer.id"
)]
async fn place(tx: &mut PgConnection, event: &OrderPlaced) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut *tx).await?;
    let _ = event.amount_cents;
    Ok(())
}

async fn deliver(idem: &Idem, event: &OrderPlaced) {
    let _ = place(idem, event).await;
}

fn main() {
    let _ = deliver;
}
