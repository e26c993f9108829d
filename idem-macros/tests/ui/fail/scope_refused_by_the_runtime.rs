//! A scope the runtime refuses at a handler's first run (a NUL character, more than 200
//! bytes) is refused at compile time, in the runtime's words. Bytes are counted, not
//! characters: 101 `é` are 202 bytes; 100 `é`, 200 bytes, are allowed.
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", scope = "nul\0scope")]
async fn nul(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(
    key = "order_id",
    scope = "éééééééééééééééééééééééééééééééééééééééééééééééééé\
             ééééééééééééééééééééééééééééééééééééééééééééééééééé"
)]
async fn long(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

#[idempotent(
    key = "order_id",
    scope = "éééééééééééééééééééééééééééééééééééééééééééééééééé\
             éééééééééééééééééééééééééééééééééééééééééééééééééé"
)]
async fn longest(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

fn main() {}
