//! The order-event handlers: business writes in the transaction of the idempotency claim.
//!
//! Both handlers share one scope, so a consumer can switch between the two offset stores
//! without re-applying anything: a key that succeeded under one is a duplicate under the
//! other.

use idem_runtime::idempotent;
use sqlx::PgConnection;

use super::offsets::Position;
use crate::orders::{EventType, OrderEvent};

/// The handlers' scope in the status table.
pub const SCOPE: &str = "apply_order_event";

/// Failed attempts after which an event's key is parked (and the message dead-lettered).
pub const MAX_ATTEMPTS: u32 = 3;

/// The second business table: one row per order, updated by every applied event.
///
/// `events` and `amount_cents` add up the applied events, so that an event applied twice
/// shows here as well as in `order_effects`.
pub const CREATE_ORDER_TOTALS: &str = "CREATE TABLE IF NOT EXISTS order_totals (
    order_id text PRIMARY KEY,
    events integer NOT NULL,
    amount_cents bigint NOT NULL,
    last_event text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)";

/// Why applying an event failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The event breaks a business rule; every retry fails the same way, so the key ends
    /// up parked after [`MAX_ATTEMPTS`].
    #[error("order {order_id}: the amount must not be negative, got {amount_cents} cents")]
    NegativeAmount {
        /// The order.
        order_id: String,
        /// The amount received.
        amount_cents: i64,
    },
    /// A business write failed.
    #[error("writing the order's effects failed")]
    Database(#[from] sqlx::Error),
}

/// Applies an order event: one `order_effects` row and the order's `order_totals`, once
/// per producer key (`event_key`), whatever the number of deliveries.
///
/// The key is the producer's stamp ([`producer::event_key`](super::producer::event_key)
/// derives it from `order_id` and `event_type`); a message without one is refused with
/// [`idem_runtime::Error::Key`]. The fingerprint catches a stamp reused for another fact.
#[idempotent(
    key = "event_key",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "apply_order_event",
    max_attempts = 3,
    store_result = false
)]
pub async fn apply_order_event(
    tx: &mut PgConnection,
    event: &OrderEvent,
) -> Result<(), ApplyError> {
    write_effects(tx, event).await
}

/// [`apply_order_event`], plus the consumer's position stored in the same transaction:
/// the effects and "this message is consumed" commit together.
#[idempotent(
    key = "event_key",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "apply_order_event",
    max_attempts = 3,
    store_result = false
)]
pub async fn apply_order_event_at(
    tx: &mut PgConnection,
    event: &OrderEvent,
    position: &Position,
) -> Result<(), ApplyError> {
    write_effects(tx, event).await?;
    position.store(tx).await?;
    Ok(())
}

/// The business writes, in one statement (one round trip).
async fn write_effects(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), ApplyError> {
    if event.amount_cents < 0 {
        return Err(ApplyError::NegativeAmount {
            order_id: event.order_id.clone(),
            amount_cents: event.amount_cents,
        });
    }
    sqlx::query(
        "WITH effect AS (
            INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3)
        )
        INSERT INTO order_totals (order_id, events, amount_cents, last_event) VALUES ($1, 1, $3, $2)
        ON CONFLICT (order_id) DO UPDATE SET
            events = order_totals.events + 1,
            amount_cents = order_totals.amount_cents + EXCLUDED.amount_cents,
            last_event = EXCLUDED.last_event,
            updated_at = now()",
    )
    .bind(&event.order_id)
    .bind(event_type_name(event.event_type))
    .bind(event.amount_cents)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The event type as stored in the business tables (its JSON name).
pub fn event_type_name(event_type: EventType) -> &'static str {
    match event_type {
        EventType::Placed => "placed",
        EventType::Paid => "paid",
        EventType::Shipped => "shipped",
    }
}
