//! The order-event handlers: business writes in the transaction of the idempotency claim.
//!
//! The handlers share one scope, so a consumer can switch between the two offset stores,
//! and between the per-message and the batch path, without re-applying anything: a key
//! that succeeded under one is a duplicate under the others.
//!
//! [`OrderEvents`] is what the demo's consumers do with each message (an
//! [`idem_kafka::Handler`]): decode it, and call the handler that fits the offset store
//! and the path.

use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

use crate::orders::{EventType, OrderEvent};
use idem_kafka::{BatchPositions, Fate, Handler, Position};

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
/// per producer key (`event_key`) and fact's time (`occurred_at`), whatever the number of
/// deliveries.
///
/// The key is the producer's stamp ([`producer::event_key`](super::producer::event_key)
/// derives it from `order_id` and `event_type`) with the time the producer stamped on the
/// fact; a message without a key is refused with [`idem_runtime::Error::Key`]. The
/// fingerprint catches a stamp reused for another fact. The keys are kept by the fact's
/// time (`event_time`): each in the time bucket of its fact, dropped whole once the
/// retention window has passed; a fact older than the window is refused
/// ([`idem_runtime::Error::OutsideWindow`]) and dead-lettered.
///
/// `batch = true` also generates `apply_order_event_batch(&idem, &events)`: all keys
/// claimed in one statement, one transaction and one commit for the batch.
#[idempotent(
    key = "event_key, occurred_at",
    event_time = "occurred_at",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "apply_order_event",
    shared_scope = true,
    max_attempts = 3,
    store_result = false,
    batch = true
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
    key = "event_key, occurred_at",
    event_time = "occurred_at",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "apply_order_event",
    shared_scope = true,
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

/// The batch variant of [`apply_order_event_at`]: use the generated
/// `apply_order_event_at_offsets_batch(&idem, &events, &offsets)`. The positions of the
/// whole batch are stored once, by the first body of the batch transaction, up to the
/// first message that is not done (see [`BatchPositions`]).
#[idempotent(
    key = "event_key, occurred_at",
    event_time = "occurred_at",
    fingerprint = "order_id, event_type, amount_cents",
    scope = "apply_order_event",
    shared_scope = true,
    max_attempts = 3,
    store_result = false,
    batch = true
)]
pub async fn apply_order_event_at_offsets(
    tx: &mut PgConnection,
    event: &OrderEvent,
    offsets: &BatchPositions,
) -> Result<(), ApplyError> {
    let written = async {
        write_effects(&mut *tx, event).await?;
        offsets.store_once(&mut *tx).await?;
        Ok(())
    };
    let result = written.await;
    if result.is_err() {
        // The transaction rolls back, positions included: the next one stores them.
        offsets.forget();
    }
    result
}

/// The order consumer's handling of a message: a JSON [`OrderEvent`], applied by
/// [`apply_order_event`] (offsets in Kafka) or [`apply_order_event_at`] (offsets in
/// PostgreSQL), or by their batch variants on the batch path.
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderEvents;

impl Handler for OrderEvents {
    type Message = OrderEvent;

    fn decode(&self, payload: &[u8]) -> Result<OrderEvent, String> {
        decode_order_event(payload)
    }

    async fn handle(&self, idem: &Idem, event: &OrderEvent, position: Option<&Position>) -> Fate {
        Fate::of(match position {
            None => apply_order_event(idem, event).await,
            Some(position) => apply_order_event_at(idem, event, position).await,
        })
    }

    fn stores_position(&self) -> bool {
        true
    }

    async fn handle_batch(
        &self,
        idem: &Idem,
        events: &[OrderEvent],
        positions: Option<&[Position]>,
    ) -> Vec<Fate> {
        let outcomes = match positions {
            None => apply_order_event_batch(idem, events).await,
            Some(positions) => {
                // The keys the batch handler derives, from its generated key function:
                // each looked up in its fact's time bucket.
                let keys = events
                    .iter()
                    .map(|event| apply_order_event_at_offsets_key(event).ok());
                let offsets = BatchPositions::of_handler_keys(idem, positions, keys);
                apply_order_event_at_offsets_batch(idem, events, &offsets).await
            }
        };
        outcomes.into_iter().map(Fate::of).collect()
    }
}

/// Decodes a JSON order event.
pub fn decode_order_event(payload: &[u8]) -> Result<OrderEvent, String> {
    serde_json::from_slice(payload)
        .map_err(|error| format!("the payload is not an order event: {error}"))
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
