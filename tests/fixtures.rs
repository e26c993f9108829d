//! The fixtures of the cross-crate suites: the demo's business table `order_effects` over
//! a runtime migrated by idem-runtime's testing kit, `paid` order events, and the business
//! write of a handler.
//!
//! ```no_run
//! # async fn test(pool: sqlx::PgPool) {
//! let idem = fixtures::setup(&pool).await;
//! assert_eq!(idem_runtime::testing::count_rows(&pool, "order_effects").await, 0);
//! # let _ = idem; }
//! ```

use idem_demo::orders::{CREATE_ORDER_EFFECTS, EventType, OrderEvent};
use idem_runtime::{Idem, testing};
use sqlx::PgPool;

/// Creates the business table `order_effects` and returns [`testing::idem`]: a runtime
/// handle with the default settings, its status table migrated (schema `idem`).
pub async fn setup(pool: &PgPool) -> Idem {
    sqlx::query(CREATE_ORDER_EFFECTS)
        .execute(pool)
        .await
        .expect("create order_effects");
    testing::idem(pool.clone()).await
}

/// A `paid` event of `order_id` for `amount_cents`.
pub fn paid(order_id: &str, amount_cents: i64) -> OrderEvent {
    OrderEvent {
        order_id: order_id.to_owned(),
        event_type: EventType::Paid,
        amount_cents,
        occurred_at: chrono::Utc::now(),
        event_key: None,
    }
}

/// Records `event` in `order_effects` through the handler's connection; returns the new
/// row's id.
pub async fn insert_effect(
    conn: &mut sqlx::PgConnection,
    event: &OrderEvent,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(&event.order_id)
    .bind(format!("{:?}", event.event_type).to_lowercase())
    .bind(event.amount_cents)
    .fetch_one(conn)
    .await
}
