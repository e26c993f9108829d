use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

// The default scope belongs to one handler: sharing needs a scope named on purpose.
#[idempotent(key = "order_id", shared_scope = true)]
async fn record(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

fn main() {}
