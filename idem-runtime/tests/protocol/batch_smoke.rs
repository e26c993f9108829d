//! Batches: new messages execute once, duplicates inside the batch and against the table are skipped.
use crate::support::orders::{CREATE_ORDER_EFFECTS, EventType, OrderEvent};
use idem_runtime::{Idem, Outcome, idempotent};
use sqlx::{PgConnection, PgPool};

#[idempotent(key = "order_id, event_type", batch = true)]
async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<String, sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, 'paid', $2)",
    )
    .bind(&event.order_id)
    .bind(event.amount_cents)
    .execute(&mut *tx)
    .await?;
    Ok(event.order_id.clone())
}

fn event(order: &str) -> OrderEvent {
    OrderEvent {
        order_id: order.into(),
        event_type: EventType::Paid,
        amount_cents: 5,
        occurred_at: chrono::Utc::now(),
        event_key: None,
    }
}

#[sqlx::test(migrations = false)]
async fn batch_smoke(pool: PgPool) {
    sqlx::query(CREATE_ORDER_EFFECTS)
        .execute(&pool)
        .await
        .unwrap();
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    assert!(apply(&idem, &event("o0")).await.unwrap().is_executed());
    let batch = vec![event("o0"), event("o1"), event("o2"), event("o1")];
    let outcomes = apply_batch(&idem, &batch).await;
    let outcomes: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Duplicate(Some("o0".into())),
            Outcome::Executed("o1".into()),
            Outcome::Executed("o2".into()),
            Outcome::Duplicate(Some("o1".into())),
        ]
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM order_effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 3);
    let task = tokio::spawn({
        let idem = idem.clone();
        async move { apply_batch(&idem, &batch).await.len() }
    });
    assert_eq!(task.await.unwrap(), 4);
}
