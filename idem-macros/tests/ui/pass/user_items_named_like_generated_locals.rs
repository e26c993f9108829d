//! The generated code's locals do not clash with the user's items: a `SPEC`, `key` or
//! `result` of the user's own, used in the body, is the user's.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

const SPEC: &str = "the user's own spec";

#[allow(non_upper_case_globals)]
const key: u32 = 7;

#[allow(non_upper_case_globals)]
static result: u32 = 35;

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(format!("{SPEC} {}", key + result))
}

#[idempotent(key = "order_id", batch = true)]
async fn apply_each(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(SPEC.to_owned())
}

#[idempotent(key = "order_id")]
async fn apply_all(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<(), sqlx::Error> {
    let _ = (tx, events, SPEC, key, result);
    Ok(())
}

async fn deliver(idem: &Idem, event: OrderEvent) {
    let _: Option<String> = apply(idem, &event).await.ok().and_then(|outcome| outcome.into_value());
    let _ = apply_each_batch(idem, std::slice::from_ref(&event)).await;
    let _ = apply_all(idem, &[event]).await;
}

fn main() {
    let _ = deliver;
}
