//! Lease mode: a first delivery executes under a lease, a second is a duplicate.
use idem_runtime::lease::Lease;
use idem_runtime::{Idem, Outcome, idempotent};
use idem_suite::orders::{EventType, OrderEvent};
use sqlx::PgPool;

#[idempotent(key = "order_id", mode = "lease", lease = "2s")]
async fn notify(lease: &Lease, event: &OrderEvent) -> Result<String, std::io::Error> {
    Ok(format!("{} {}", event.order_id, lease.attempt()))
}

#[idempotent(key = "order_id", mode = "lease")]
async fn notify_without_guard(event: OrderEvent) -> Result<(), std::io::Error> {
    let _ = event;
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn lease_smoke(pool: PgPool) {
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    let event = OrderEvent { order_id: "o1".into(), event_type: EventType::Paid, amount_cents: 5, occurred_at: chrono::Utc::now(), event_key: None };
    assert_eq!(notify(&idem, &event).await.unwrap(), Outcome::Executed("o1 1".into()));
    assert_eq!(notify(&idem, &event).await.unwrap(), Outcome::Duplicate(Some("o1 1".into())));
    let task = tokio::spawn({ let idem = idem.clone(); let event = event.clone(); async move { notify_without_guard(&idem, event).await.unwrap() } });
    assert!(task.await.unwrap().is_executed());
}
