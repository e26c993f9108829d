// The cache arguments are checked like the others, with or without the `redis` feature.
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Event {
    order_id: String,
}

#[idempotent(key = "order_id", cache = false, cache_ttl = "10m")]
async fn contradictory(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

#[idempotent(key = "order_id", cache_ttl = "soon")]
async fn not_a_duration(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

#[idempotent(key = "order_id", cache_ttl = "0s")]
async fn zero(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

#[idempotent(key = "order_id", cache = "no")]
async fn not_a_bool(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

#[idempotent(key = "order_id", cache = false, cache = true)]
async fn repeated(_tx: &mut PgConnection, _event: &Event) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
