use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    event_id: u64,
}

// The previous key names a field the message no longer has.
#[idempotent(key = "event_id", previous_key = "order_ref")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, event.event_id);
    Ok(())
}

fn main() {}
