use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

// One body run for many messages has no value per message.
#[idempotent(key = "order_id")]
async fn record_orders(tx: &mut PgConnection, events: &[&OrderEvent]) -> Result<Vec<i64>, sqlx::Error> {
    let _ = tx;
    Ok(events.iter().map(|e| e.order_id.len() as i64).collect())
}

fn main() {}
