//! The connection may be named through any path and bound mutably.
use idem_runtime::{Idem, idempotent};

struct OrderEvent {
    order_id: String,
}

#[idempotent(key = "order_id", scope = "a")]
async fn full_path(tx: &mut sqlx::PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT $1")
        .bind(&event.order_id)
        .execute(tx)
        .await?;
    Ok(())
}

#[idempotent(key = "order_id", scope = "b")]
async fn postgres_path(
    mut conn: &mut sqlx::postgres::PgConnection,
    event: &OrderEvent,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT $1")
        .bind(&event.order_id)
        .execute(&mut *conn)
        .await?;
    conn = &mut *conn;
    let _ = conn;
    Ok(())
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let _ = full_path(idem, event).await;
    let _ = postgres_path(idem, event).await;
}

fn main() {
    let _ = deliver;
}
