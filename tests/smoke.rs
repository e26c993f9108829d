//! The basic path: a first delivery executes, a second is a duplicate with the stored result.
use idem_runtime::{Idem, Outcome, idempotent};
use idem_suite::orders::{CREATE_ORDER_EFFECTS, EventType, OrderEvent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type")]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3) RETURNING id")
        .bind(&event.order_id)
        .bind("paid")
        .bind(event.amount_cents)
        .fetch_one(&mut *tx)
        .await
}

#[sqlx::test(migrations = false)]
async fn smoke(pool: PgPool) {
    sqlx::query(CREATE_ORDER_EFFECTS).execute(&pool).await.unwrap();
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    let event = OrderEvent { order_id: "o1".into(), event_type: EventType::Paid, amount_cents: 5, occurred_at: chrono::Utc::now(), event_key: None };
    let first = apply(&idem, &event).await.unwrap();
    let second = apply(&idem, &event).await.unwrap();
    assert!(matches!(first, Outcome::Executed(_)));
    assert_eq!(second, Outcome::Duplicate(first.into_value()));
    let handle = tokio::spawn({ let idem = idem.clone(); let event = event.clone(); async move { apply(&idem, &event).await.unwrap() } });
    assert!(handle.await.unwrap().is_duplicate());
}
