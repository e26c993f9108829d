use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

// A lease-mode body runs outside any transaction: it cannot ask for one.
#[idempotent(key = "order_id", mode = "lease")]
async fn notify(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), std::io::Error> {
    let _ = (tx, &event.order_id);
    Ok(())
}

fn main() {}
