use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Payment {
    order_id: String,
    amount: f64,
    currency: String,
}

// In a key of several fields, the error names the field at fault (and, written as
// identifiers, points at it).
#[idempotent(key(order_id, amount, currency))]
async fn by_identifiers(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, &payment.order_id, &payment.currency);
    Ok(())
}

#[idempotent(key = "order_id, currency, order-id")]
async fn dashed(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, payment);
    Ok(())
}

#[idempotent(key = "order_id, currency", fingerprint = "currency, order_id, currency")]
async fn twice(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, payment);
    Ok(())
}

#[idempotent(key(order_id, currency, order_id))]
async fn twice_as_identifiers(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    let _ = (tx, payment);
    Ok(())
}

fn main() {}
