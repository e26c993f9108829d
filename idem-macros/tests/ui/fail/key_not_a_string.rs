use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

// A malformed argument does not hide the others, nor make `key` look missing.
#[idempotent(key = order_id, max_attempt = 3, store_result = "no")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

fn main() {}
