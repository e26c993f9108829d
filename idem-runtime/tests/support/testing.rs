//! A migrated runtime over a test's fresh database with the business table `order_effects`,
//! order events, and idem's own test helpers (`idem_runtime::testing`).
//!
//! The demo's package (`idem-demo`) and the cross-crate suites' fixtures (`tests/`) hold
//! the same fixtures; these tests cannot use them: those packages depend on idem-runtime,
//! and a dev-dependency on them would link a second copy of the runtime, whose `Idem`
//! and `KeyPart` are other types than those of the crate under test.

use idem_runtime::Idem;
// Not every test binary uses all of them.
#[allow(unused_imports)]
pub use idem_runtime::testing::*;
use sqlx::PgPool;

use super::orders::{CREATE_ORDER_EFFECTS, EventType, OrderEvent};

/// Creates the business table `order_effects` and the status table (schema `idem`), and
/// returns a runtime handle with the default settings.
pub async fn setup(pool: &PgPool) -> Idem {
    setup_with(Idem::new(pool.clone())).await
}

/// Creates the business table `order_effects` and migrates `idem`'s status table.
pub async fn setup_with(idem: Idem) -> Idem {
    sqlx::query(CREATE_ORDER_EFFECTS)
        .execute(idem.pool())
        .await
        .expect("create order_effects");
    idem.migrate().await.expect("migrate the status table");
    idem
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
