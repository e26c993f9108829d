//! The handler's error may be generic, or a user enum converting from `sqlx::Error`.
use idem_runtime::{Error, Idem, Outcome, idempotent};
use sqlx::PgConnection;

struct OrderEvent {
    order_id: String,
}

#[derive(Debug, thiserror::Error)]
enum ApplyError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("order {0} is unknown")]
    UnknownOrder(String),
}

#[idempotent(key = "order_id")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<u32, ApplyError> {
    sqlx::query("SELECT 1").execute(&mut *tx).await?;
    if event.order_id.is_empty() {
        return Err(ApplyError::UnknownOrder(event.order_id.clone()));
    }
    Ok(1)
}

#[idempotent(key = "order_id", scope = "apply_generic")]
async fn apply_generic<'a, E>(tx: &mut PgConnection, event: &'a OrderEvent) -> Result<usize, E>
where
    E: std::error::Error + From<sqlx::Error> + Send + 'static,
{
    sqlx::query("SELECT 1").execute(&mut *tx).await?;
    Ok(event.order_id.len())
}

#[derive(Debug, thiserror::Error)]
#[error("wrapped: {0}")]
struct Wrapped<E: std::error::Error + 'static>(#[source] E);

#[idempotent(key = "order_id", scope = "apply_wrapped")]
async fn apply_wrapped(
    tx: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), Wrapped<std::io::Error>> {
    let _ = (tx, &event.order_id);
    Err(Wrapped(std::io::Error::other("disk full")))
}

async fn deliver(idem: &Idem, event: &OrderEvent) {
    let outcome: Result<Outcome<u32>, Error<ApplyError>> = apply(idem, event).await;
    let _ = outcome.map_err(|error| error.disposition());
    let generic: Result<Outcome<usize>, Error<sqlx::Error>> = apply_generic(idem, event).await;
    let _ = generic;
    let _ = apply_wrapped(idem, event).await;
}

fn main() {
    let _ = deliver;
}
