// Without the `redis` feature, the handler-level cache arguments name the feature to enable.
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Event {
    order_id: String,
}

#[idempotent(key = "order_id", cache = false)]
async fn uncached(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

#[idempotent(key = "order_id", cache_ttl = "30m")]
async fn short_lived(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
