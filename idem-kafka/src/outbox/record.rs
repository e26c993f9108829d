//! An outgoing record, as a handler's body describes it.

use serde::Serialize;
use uuid::Uuid;

use super::OutboxError;

/// A record to publish: its topic, Kafka key, partition, headers and payload, and the
/// name that its idempotency key is derived under.
///
/// ```
/// use idem_kafka::outbox::Record;
///
/// #[derive(serde::Serialize)]
/// struct Receipt<'a> { order_id: &'a str, amount_cents: i64 }
///
/// let record = Record::to("receipts")
///     .name("receipt")
///     .key("order-1")
///     .header("content-type", "application/json")
///     .json(&Receipt { order_id: "order-1", amount_cents: 1250 })?;
/// # Ok::<(), idem_kafka::outbox::OutboxError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Record {
    pub(super) topic: String,
    pub(super) name: Option<String>,
    pub(super) message: usize,
    pub(super) idem_key: Option<Uuid>,
    pub(super) key: Option<Vec<u8>>,
    pub(super) partition: Option<i32>,
    pub(super) headers: Vec<(String, Vec<u8>)>,
    pub(super) payload: Option<Vec<u8>>,
}

impl Record {
    /// A record for `topic`, without key, headers or payload yet.
    pub fn to(topic: impl Into<String>) -> Self {
        Record {
            topic: topic.into(),
            name: None,
            message: 0,
            idem_key: None,
            key: None,
            partition: None,
            headers: Vec::new(),
            payload: None,
        }
    }

    /// The name its idempotency key is derived under, unique among the records that one
    /// run of the body sends (a second record of the name is refused when sent):
    /// `"receipt"`, `"reserve-stock"`. Without a name, a record is named by its position
    /// among the body's unnamed records (`"#0"`, `"#1"`, ...), which changes when a later
    /// build sends them in another order: name them. Names starting with `#` are the
    /// positions' own.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// In a batch handler's body (whose message parameter is a slice), the number of the
    /// message in that slice that the record follows from (0 by default). Its key is
    /// derived from that message's key.
    pub fn for_message(mut self, index: usize) -> Self {
        self.message = index;
        self
    }

    /// The record's idempotency key, given rather than derived: for records sent outside
    /// a handler's body, or keyed on a fact of their own.
    pub fn idempotency_key(mut self, key: Uuid) -> Self {
        self.idem_key = Some(key);
        self
    }

    /// The Kafka key: the record's partition (by the producer's partitioner) and its order
    /// among the records of the same key.
    pub fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.key = Some(key.as_ref().to_vec());
        self
    }

    /// A partition of the topic, rather than the one its key maps to.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// A header. `idem-key` and `traceparent` are the outbox's own: the first is refused
    /// when sent, the second replaced by the handling span's trace context where there is
    /// one.
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// The payload's bytes.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }

    /// The payload as JSON.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Result<Self, OutboxError> {
        self.payload = Some(serde_json::to_vec(value).map_err(OutboxError::Json)?);
        Ok(self)
    }
}
