use idem_runtime::idempotent;
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

struct Payments {
    applied: u64,
}

impl Payments {
    #[idempotent(key = "order_id")]
    async fn apply(
        &mut self,
        tx: &mut PgConnection,
        event: &OrderEvent,
    ) -> Result<(), sqlx::Error> {
        let _ = (tx, &event.order_id);
        self.applied += 1;
        Ok(())
    }
}

#[idempotent(key = "order_id")]
async fn apply(
    tx: &mut PgConnection,
    event: &OrderEvent,
    applied: &mut u64,
) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id);
    *applied += 1;
    Ok(())
}

fn main() {}
