//! The key of a message for one handler, as callers compute it: what `<handler>_key`,
//! generated next to every `#[idempotent]` handler, returns.

use chrono::{DateTime, Utc};

use super::{IdempotencyKey, fingerprints_differ};

/// The key that an `#[idempotent]` handler derives from a message, with the handler's
/// scope and the message's payload fingerprint: the `(scope, key)` row of the status
/// table that a delivery of the message claims, and the fingerprint recorded with it.
///
/// `#[idempotent]` generates `<handler>_key(message)` next to every handler, returning
/// this, so that producers, consumers that track positions, tests and tools compute the
/// key exactly as the handler does, from its own `key` and `fingerprint` arguments,
/// instead of deriving it again with [`KeyBuilder`](super::KeyBuilder):
///
/// ```
/// use idem_runtime::{HandlerKey, idempotent};
/// use sqlx::PgConnection;
///
/// struct OrderEvent {
///     order_id: String,
///     event_type: String,
///     amount_cents: i64,
/// }
///
/// #[idempotent(key = "order_id, event_type", fingerprint = "amount_cents", scope = "orders")]
/// async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
///     # let _ = (tx, event);
///     Ok(())
/// }
///
/// let event = OrderEvent { order_id: "order-1".into(), event_type: "paid".into(), amount_cents: 100 };
/// let key: HandlerKey = apply_key(&event)?;
/// assert_eq!(key.scope(), "orders");
/// assert_eq!(key.key().to_string(), "804192a5-97d2-8f62-9aa5-941e1b1f8c6f");
/// assert!(key.fingerprint().is_some());
/// # Ok::<(), idem_runtime::KeyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandlerKey {
    scope: &'static str,
    key: IdempotencyKey,
    fingerprint: Option<[u8; 32]>,
    previous_key: Option<IdempotencyKey>,
    fact_time: Option<DateTime<Utc>>,
}

impl HandlerKey {
    /// The handler's scope: its `scope = "..."`, or by default its module path and name
    /// (`my_crate::orders::apply`). The status table's `scope` column.
    pub const fn scope(&self) -> &'static str {
        self.scope
    }

    /// The message's idempotency key. The status table's `key` column.
    pub const fn key(&self) -> IdempotencyKey {
        self.key
    }

    /// The SHA-256 payload fingerprint of the handler's `fingerprint` fields, or `None`
    /// when it declares none. The status table's `fingerprint` column.
    pub const fn fingerprint(&self) -> Option<[u8; 32]> {
        self.fingerprint
    }

    /// The message's key under the handler's previous key definition
    /// (`#[idempotent(previous_key = "...")]`), which a delivery claims too: `None` when
    /// the handler declares none, or when the message has no value for it.
    pub const fn previous_key(&self) -> Option<IdempotencyKey> {
        self.previous_key
    }

    /// The fact's time, to the microsecond, where the handler keeps its keys by it
    /// (`#[idempotent(event_time = "...")]`): the bucket of the key's row (see
    /// [`time_buckets`](crate::time_buckets)).
    pub const fn fact_time(&self) -> Option<DateTime<Utc>> {
        self.fact_time
    }

    /// Whether the handler refuses this message as another payload of a key recorded
    /// with the fingerprint `recorded` ([`Error::PayloadMismatch`](crate::Error)): both
    /// fingerprints known and different. A side without one never differs.
    pub fn fingerprint_differs(&self, recorded: Option<&[u8]>) -> bool {
        fingerprints_differ(
            self.fingerprint.as_ref().map(<[u8; 32]>::as_slice),
            recorded,
        )
    }
}

/// The [`HandlerKey`] of a handler's `scope`, for the code `#[idempotent]` generates.
pub fn handler_key(scope: &'static str, keys: MessageKeys) -> HandlerKey {
    HandlerKey {
        scope,
        key: keys.key,
        fingerprint: keys.fingerprint,
        previous_key: keys.previous,
        fact_time: keys.fact_time,
    }
}

/// What a handler derives from one message, as generated code passes it to the runners:
/// the key, the payload fingerprint, and the key under the previous definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageKeys {
    /// The message's idempotency key.
    pub key: IdempotencyKey,
    /// The digest of the fingerprint's fields, where the handler declares some.
    pub fingerprint: Option<[u8; 32]>,
    /// The key under the previous definition (`previous_key = "..."`), where the handler
    /// declares one and the message has its values.
    pub previous: Option<IdempotencyKey>,
    /// The fact's time (`event_time = "..."`), where the handler keeps its keys by it.
    pub fact_time: Option<DateTime<Utc>>,
}

impl MessageKeys {
    /// The fingerprint as bytes.
    pub(crate) fn fingerprint(&self) -> Option<&[u8]> {
        self.fingerprint.as_ref().map(<[u8; 32]>::as_slice)
    }
}
