//! What a consumer does with the messages it receives.

use std::future::Future;

use idem_runtime::Idem;

use crate::fate::Fate;
use crate::position::Position;
use crate::received::Received;

/// What a consumer does with its messages: decode them and hand them to an
/// `#[idempotent]` handler. The consumer does the rest: offsets, dead letters, retries,
/// rebalances, shutdown.
///
/// ```no_run
/// use idem_kafka::{Fate, Handler, Position};
/// use idem_runtime::{Idem, idempotent};
/// use sqlx::PgConnection;
///
/// #[derive(serde::Deserialize)]
/// struct Payment { order_id: String, amount_cents: i64 }
///
/// #[idempotent(key = "order_id")]
/// async fn record_payment(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2)")
///         .bind(&payment.order_id)
///         .bind(payment.amount_cents)
///         .execute(&mut *tx)
///         .await
///         .map(|_| ())
/// }
///
/// struct Payments;
///
/// impl Handler for Payments {
///     type Message = Payment;
///
///     fn decode(&self, payload: &[u8]) -> Result<Payment, String> {
///         idem_kafka::decode_json(payload)
///     }
///
///     async fn handle(&self, idem: &Idem, payment: &Payment, _: Option<&Position>) -> Fate {
///         Fate::of(record_payment(idem, payment).await)
///     }
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// A decoded message.
    type Message: Send + Sync + 'static;

    /// Decodes a payload; `Err` (the reason) dead-letters the message as
    /// [`Reason::Undecodable`](crate::Reason::Undecodable).
    fn decode(&self, payload: &[u8]) -> Result<Self::Message, String>;

    /// Decodes a message from all of it: its payload, Kafka key and headers (a record
    /// sent through an outbox carries its idempotency key in a header; see
    /// [`Keyed`](crate::Keyed)). The default decodes the payload with
    /// [`decode`](Self::decode), and refuses a message without one.
    fn decode_received(&self, received: &Received<'_>) -> Result<Self::Message, String> {
        match received.payload() {
            None => Err("the message has no payload".to_owned()),
            Some(payload) => self.decode(payload),
        }
    }

    /// Handles one message. With offsets in PostgreSQL, `position` is the partition's
    /// position after the message, for a handler that stores it in the transaction of
    /// its effects (see [`stores_position`](Self::stores_position)).
    fn handle(
        &self,
        idem: &Idem,
        message: &Self::Message,
        position: Option<&Position>,
    ) -> impl Future<Output = Fate> + Send;

    /// Whether [`handle`](Self::handle) writes `position` in the transaction of its
    /// effects when it executes. If not (the default), the consumer records the position
    /// with its next flush (every commit interval).
    fn stores_position(&self) -> bool {
        false
    }

    /// Handles several messages (with a batch size above 1); returns one fate per
    /// message, in order, or fewer: the messages without one are handled again later.
    /// With offsets in PostgreSQL, `positions` holds each message's position after it.
    ///
    /// Whatever the handler stores of `positions` must never pass a message that is not
    /// done when its transaction commits: [`BatchPositions`](crate::BatchPositions) does
    /// that for `#[idempotent(batch = true)]` handlers.
    ///
    /// The default handles the messages one by one and stops after the first one to
    /// retry; it stores no position (the consumer's flush does).
    fn handle_batch(
        &self,
        idem: &Idem,
        messages: &[Self::Message],
        positions: Option<&[Position]>,
    ) -> impl Future<Output = Vec<Fate>> + Send {
        let _ = positions;
        async move {
            let mut fates = Vec::with_capacity(messages.len());
            for message in messages {
                let fate = self.handle(idem, message, None).await;
                let retry = !fate.is_final();
                fates.push(fate);
                if retry {
                    break;
                }
            }
            fates
        }
    }
}

/// Decodes a JSON payload with serde: the usual [`Handler::decode`].
pub fn decode_json<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    serde_json::from_slice(payload).map_err(|error| format!("the payload is not valid: {error}"))
}
