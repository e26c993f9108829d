//! A message as a handler decodes it: payload, Kafka key, headers, coordinates.

use uuid::Uuid;

use crate::delivery::Delivery;
use crate::outbox::KEY_HEADER;

/// A message as [`Handler::decode_received`](crate::Handler::decode_received) sees it.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    delivery: &'a Delivery,
}

impl<'a> Received<'a> {
    pub(crate) fn new(delivery: &'a Delivery) -> Self {
        Received { delivery }
    }

    /// The payload, if any.
    pub fn payload(&self) -> Option<&'a [u8]> {
        self.delivery.payload.as_deref()
    }

    /// The Kafka key, if any.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.delivery.key.as_deref()
    }

    /// The value of the header `name` (the last one, if several have the name).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.delivery.header(name)
    }

    /// The topic.
    pub fn topic(&self) -> &'a str {
        &self.delivery.topic
    }

    /// The partition.
    pub fn partition(&self) -> i32 {
        self.delivery.partition
    }

    /// The offset.
    pub fn offset(&self) -> i64 {
        self.delivery.offset
    }

    /// The idempotency key that an outbox stamped on the record ([`KEY_HEADER`]), or why
    /// there is none.
    pub fn idem_key(&self) -> Result<Uuid, String> {
        let value = self
            .header(KEY_HEADER)
            .ok_or_else(|| format!("the message has no {KEY_HEADER} header"))?;
        let key = std::str::from_utf8(value)
            .ok()
            .and_then(|text| Uuid::parse_str(text).ok())
            .ok_or_else(|| format!("the {KEY_HEADER} header is not a UUID"))?;
        if key.is_nil() {
            return Err(format!(
                "the {KEY_HEADER} header is the nil UUID, which no outbox derives"
            ));
        }
        Ok(key)
    }
}

/// A message with the idempotency key that the sending outbox stamped on it: key its
/// handler on the field `idem_key` in one line, `#[idempotent(key = "idem_key")]`, and
/// read the payload through `message`.
///
/// ```no_run
/// use idem_kafka::{Fate, Handler, Keyed, Position, Received};
/// use idem_runtime::{Idem, idempotent};
/// use sqlx::PgConnection;
///
/// #[derive(serde::Deserialize)]
/// struct Receipt { order_id: String }
///
/// #[idempotent(key = "idem_key")]
/// async fn send_receipt(tx: &mut PgConnection, receipt: &Keyed<Receipt>) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO receipts (order_id) VALUES ($1)")
///         .bind(&receipt.message.order_id)
///         .execute(&mut *tx)
///         .await
///         .map(|_| ())
/// }
///
/// struct Receipts;
///
/// impl Handler for Receipts {
///     type Message = Keyed<Receipt>;
///     fn decode(&self, payload: &[u8]) -> Result<Keyed<Receipt>, String> {
///         Err("decoded with its headers".to_owned())
///     }
///     fn decode_received(&self, received: &Received<'_>) -> Result<Keyed<Receipt>, String> {
///         Keyed::decode_json(received)
///     }
///     async fn handle(&self, idem: &Idem, receipt: &Keyed<Receipt>, _: Option<&Position>) -> Fate {
///         Fate::of(send_receipt(idem, receipt).await)
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed<T> {
    /// The record's idempotency key, from its [`KEY_HEADER`].
    pub idem_key: Uuid,
    /// The decoded payload.
    pub message: T,
}

impl<T: serde::de::DeserializeOwned> Keyed<T> {
    /// The payload decoded as JSON, with the key from the header; `Err` (dead-lettered
    /// as undecodable) without a valid key or payload.
    pub fn decode_json(received: &Received<'_>) -> Result<Self, String> {
        let idem_key = received.idem_key()?;
        let payload = received
            .payload()
            .ok_or_else(|| "the message has no payload".to_owned())?;
        Ok(Keyed {
            idem_key,
            message: serde_json::from_slice(payload)
                .map_err(|error| format!("the payload is not valid: {error}"))?,
        })
    }
}
