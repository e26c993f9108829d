//! With `store_result = false` the result type need not be serde; duplicates get `None`.
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

/// Not `Serialize`: it holds a connection-bound thing that cannot be stored.
struct Receipt {
    rows: std::cell::Cell<u64>,
}

#[idempotent(key = "order_id", store_result = false)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    let done = sqlx::query("SELECT 1").execute(&mut *tx).await?;
    let _ = &event.order_id;
    Ok(Receipt {
        rows: std::cell::Cell::new(done.rows_affected()),
    })
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    match apply(idem, event).await {
        Ok(Outcome::Executed(receipt)) => {
            let _ = receipt.rows.get();
        }
        Ok(Outcome::Duplicate(none)) => assert!(none.is_none()),
        Err(_) => {}
    }
}

fn main() {
    let _ = deliver;
}
