//! `crate = "..."` names the runtime when the dependency is renamed: nothing generated
//! may refer to `::idem_runtime`.
//!
//! Cargo refuses a second, renamed dependency on `idem-runtime` in the same package, so
//! this case renames it the way the compiler sees it: `::idem_runtime` is made to name
//! this crate itself (which has no private module of the runtime), and the runtime is reachable only as `idem`.
extern crate idem_runtime as idem;
extern crate self as idem_runtime;

use idem::{Idem, KeyPart, Outcome, idempotent};
use sqlx::PgConnection;

#[derive(KeyPart)]
#[key_part(crate = "idem")]
enum EventType {
    Paid,
}

struct OrderEvent {
    order_id: String,
    event_type: EventType,
}

#[idempotent(key = "order_id, event_type", fingerprint = "order_id", crate = "idem")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(1)
}

#[idempotent(
    key = "order_id",
    crate = "::idem",
    store_result = false,
    scope = "single"
)]
async fn single(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let _: Option<Outcome<i64>> = apply(idem, event).await.ok();
    let _ = single(idem, event).await;
}

fn main() {
    let _ = deliver;
    let _ = EventType::Paid;
}
