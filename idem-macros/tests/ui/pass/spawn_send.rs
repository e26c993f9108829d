//! The rewritten handler's future is `Send + 'static` when its inputs are: it can be
//! spawned from inside an async fn (a consumer loop).
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

#[derive(Clone)]
struct OrderEvent {
    order_id: String,
    amount_cents: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(key = "order_id", fingerprint = "amount_cents")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    let payment_id = sqlx::query_scalar("INSERT INTO payments (order_id) VALUES ($1) RETURNING id")
        .bind(&event.order_id)
        .fetch_one(&mut *tx)
        .await?;
    Ok(Receipt { payment_id })
}

#[idempotent(key = "order_id")]
async fn apply_owned(tx: &mut PgConnection, event: OrderEvent) -> Result<i64, sqlx::Error> {
    let _ = tx;
    Ok(event.amount_cents)
}

async fn consume(idem: Idem, events: Vec<OrderEvent>) {
    let mut tasks = Vec::new();
    for event in events {
        let idem = idem.clone();
        tasks.push(tokio::spawn(async move { apply(&idem, &event).await }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let event = OrderEvent {
        order_id: "o1".to_owned(),
        amount_cents: 1,
    };
    let owned = tokio::spawn(async move { apply_owned(&idem, event).await });
    let _ = owned.await;
}

fn require_send<F: std::future::Future + Send + 'static>(_: F) {}

#[allow(dead_code)]
fn consumer_is_send(idem: Idem, events: Vec<OrderEvent>) {
    require_send(consume(idem, events));
}

fn main() {}
