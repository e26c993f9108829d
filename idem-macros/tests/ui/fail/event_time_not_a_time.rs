use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    sequence: u64,
}

// `event_time` names a field that holds an instant.
#[idempotent(key = "order_id, sequence", event_time = "sequence")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, event.sequence);
    Ok(())
}

fn main() {}
