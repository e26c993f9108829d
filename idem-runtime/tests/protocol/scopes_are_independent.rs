//! Two handlers with different scopes each process the same message once: the scope is part of the key's identity.
use crate::support::orders::OrderEvent;
use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Outcome, idempotent, key::KeyBuilder};
use sqlx::{PgConnection, PgPool};

/// Writes the effect of `handler` for `event`.
async fn effect(
    tx: &mut PgConnection,
    handler: &str,
    event: &OrderEvent,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3) RETURNING id")
        .bind(&event.order_id)
        .bind(handler)
        .bind(event.amount_cents)
        .fetch_one(tx)
        .await
}

#[idempotent(key = "order_id, event_type", scope = "billing")]
async fn bill(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    effect(tx, "billing", event).await
}

// No `scope`: the scope is the handler's module path and name, here
// `scopes_are_independent::notify_warehouse` (the test binary's crate and the function).
#[idempotent(key = "order_id, event_type")]
async fn notify_warehouse(tx: &mut PgConnection, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    effect(tx, "notify_warehouse", event).await
}

#[sqlx::test(migrations = false)]
async fn handlers_with_different_scopes_both_process_the_same_message(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let event = testing::paid("o-scopes", 4_200);

    let billed = bill(&idem, &event).await.unwrap();
    let notified = notify_warehouse(&idem, &event).await.unwrap();
    assert!(
        billed.is_executed() && notified.is_executed(),
        "{billed:?} {notified:?}"
    );

    // Each scope deduplicates on its own.
    assert_eq!(
        bill(&idem, &event).await.unwrap(),
        Outcome::Duplicate(billed.into_value())
    );
    assert_eq!(
        notify_warehouse(&idem, &event).await.unwrap(),
        Outcome::Duplicate(notified.into_value())
    );

    let handlers: Vec<String> =
        sqlx::query_scalar("SELECT event_type FROM order_effects ORDER BY event_type")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(handlers, ["billing", "notify_warehouse"]);

    // One key, two records.
    let key = KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .part("event_type", &event.event_type)
        .unwrap()
        .finish();
    for scope in ["billing", concat!(module_path!(), "::notify_warehouse")] {
        let record = idem
            .record(scope, key)
            .await
            .unwrap()
            .expect("a record per scope");
        assert_eq!((record.status, record.attempts), (Status::Success, 1));
    }
    assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 2);
}
