//! Parameters after the message stay parameters of the rewritten handler, with their
//! declared types: owned ones are copied for each run of the body.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

struct Pricing {
    vat_percent: i64,
}

#[idempotent(key = "order_id")]
async fn apply(
    tx: &mut PgConnection,
    event: &OrderEvent,
    pricing: &Pricing,
    partition: i32,
    topic: String,
) -> Result<i64, sqlx::Error> {
    let _ = (tx, &event.order_id);
    let owned: String = topic;
    Ok(pricing.vat_percent + i64::from(partition) + owned.len() as i64)
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let pricing = Pricing { vat_percent: 20 };
    let _ = apply(idem, event, &pricing, 3, "orders".to_owned()).await;
}

fn main() {
    let _ = deliver;
}
