//! Tuple fields are keyed by their index, as in Rust: `0`, `order.1`.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderId(String);

struct Event(OrderId, u32);

#[idempotent(key = "0.0, 1")]
async fn apply(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key(0.0, 1))]
async fn apply_identifiers(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn deliver(idem: &Idem, event: &Event) {
    let _ = apply(idem, event).await;
    let _ = apply_identifiers(idem, event).await;
}

fn main() {
    let _ = deliver;
}
