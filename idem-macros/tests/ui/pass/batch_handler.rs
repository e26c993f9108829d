//! A handler whose message parameter is a slice `&[&M]` is a batch handler: the rewritten
//! function takes `(&Idem, &[M], extra parameters..)` and returns one outcome per message;
//! its future can be spawned. Keys and fingerprints work as for one message, also nested,
//! and the body sees the new messages as `&[&M]`.
use idem_runtime::batch::BatchOutcomes;
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct Order {
    id: String,
}

#[derive(Clone)]
struct OrderEvent {
    order: Order,
    event_type: String,
    amount_cents: i64,
}

#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("empty order id")]
    EmptyId,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[idempotent(
    key = "order.id, event_type",
    fingerprint = "amount_cents",
    scope = "orders",
    max_attempts = 3
)]
async fn record_orders(
    tx: &mut PgConnection,
    events: &[&OrderEvent],
    table: &str,
    topic: String,
) -> Result<(), RecordError> {
    if events.iter().any(|event| event.order.id.is_empty()) {
        return Err(RecordError::EmptyId);
    }
    let ids: Vec<&str> = events.iter().map(|event| event.order.id.as_str()).collect();
    let amounts: Vec<i64> = events.iter().map(|event| event.amount_cents).collect();
    sqlx::query(&format!(
        "INSERT INTO {table} (order_id, amount_cents, topic) SELECT *, $3 FROM unnest($1::text[], $2::bigint[])"
    ))
    .bind(&ids)
    .bind(&amounts)
    .bind(&topic)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// With an error type of `sqlx`'s own `Result` alias.
#[idempotent(key = "order.id")]
async fn touch_orders(tx: &mut PgConnection, mut events: &[&OrderEvent]) -> sqlx::Result<()> {
    events = &events[..];
    sqlx::query("SELECT 1").bind(events.len() as i64).execute(&mut *tx).await?;
    Ok(())
}

async fn consume(idem: Idem, events: Vec<OrderEvent>) {
    let task = tokio::spawn(async move {
        let outcomes: BatchOutcomes<(), RecordError> =
            record_orders(&idem, &events, "order_effects", "orders".to_owned()).await;
        let executed = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Ok(Outcome::Executed(()))))
            .count();
        let touched: Vec<idem_runtime::Handled<sqlx::Result<()>>> = touch_orders(&idem, &events).await;
        executed + touched.len()
    });
    let _ = task.await;
}

fn main() {
    let _ = consume;
}
