//! `?` and `return` in the body behave as in the original function.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
    amount_cents: i64,
}

#[derive(Debug, thiserror::Error)]
enum ApplyError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("negative amount")]
    Negative,
}

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, ApplyError> {
    if event.amount_cents < 0 {
        return Err(ApplyError::Negative);
    }
    if event.amount_cents == 0 {
        return Ok(0);
    }
    let id: i64 = sqlx::query_scalar("SELECT $1::bigint")
        .bind(event.amount_cents)
        .fetch_one(&mut *tx)
        .await?;
    let doubled = async { Ok::<_, ApplyError>(id * 2) }.await?;
    Ok(doubled)
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let _ = apply(idem, event).await;
}

fn main() {
    let _ = deliver;
}
