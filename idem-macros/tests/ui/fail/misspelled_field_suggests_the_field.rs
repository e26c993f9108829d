use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Customer {
    id: u64,
}

struct OrderEvent {
    order_id: String,
    event_type: String,
    customer: Customer,
}

// Written as identifiers, a misspelled field gets the compiler's suggestion, on the field.
#[idempotent(key(order_idd, event_type))]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.order_id, &event.event_type);
    Ok(())
}

#[idempotent(key(order_id), fingerprint(customer.idd))]
async fn nested(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    let _ = (tx, event.customer.id);
    Ok(())
}

fn main() {}
