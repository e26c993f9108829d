//! The order events the tests' handlers take.
//!
//! The demo's package (`idem-demo`) and the cross-crate suites' fixtures (`tests/`) hold
//! the same order events; these tests cannot use them: those packages depend on idem-runtime,
//! and a dev-dependency on them would link a second copy of the runtime, whose `Idem`
//! and `KeyPart` are other types than those of the crate under test.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What happened to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, idem_runtime::KeyPart)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// The order was placed.
    Placed,
    /// The order was paid.
    Paid,
    /// The order was shipped.
    Shipped,
}

/// An order event as producers publish it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderEvent {
    /// The order.
    pub order_id: String,
    /// What happened.
    pub event_type: EventType,
    /// The amount, in cents.
    pub amount_cents: i64,
    /// When it happened, as the producer saw it.
    pub occurred_at: DateTime<Utc>,
    /// The producer-side idempotency key (derived from `order_id, event_type`).
    pub event_key: Option<Uuid>,
}

/// The business table the handlers write: one row per applied event.
pub const CREATE_ORDER_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS order_effects (
    id bigserial PRIMARY KEY,
    order_id text NOT NULL,
    event_type text NOT NULL,
    amount_cents bigint NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)";
