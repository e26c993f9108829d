//! A message set aside as never handleable: what [`dead_letters`](crate::dead_letters)
//! reads back of the dead-letter table.

use crate::fate::Reason;

/// A message that can never be handled, as the consumer recorded it in the dead-letter
/// table: its coordinates, its raw key and payload bytes (to look at and replay), why it
/// was set aside and the error. Read with [`dead_letters`](crate::dead_letters).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The consumer group that set it aside.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The message's offset.
    pub offset: i64,
    /// The raw Kafka key, if the message had one.
    pub key: Option<Vec<u8>>,
    /// The raw payload, if the message had one.
    pub payload: Option<Vec<u8>>,
    /// Why it was set aside. A reason that this release does not know (written by a later
    /// one, beside this one on the same database) reads as [`Reason::Unrecoverable`]:
    /// whatever it is, the message can never be handled; [`stored_reason`](Self::stored_reason)
    /// has it as written.
    pub reason: Reason,
    /// The reason as stored in the table's `reason` column (`reason`'s
    /// [`as_str`](Reason::as_str), or a later release's own).
    pub stored_reason: String,
    /// The error, with its sources.
    pub error: String,
    /// When it was first recorded (a redelivery does not record it again).
    pub recorded_at: chrono::DateTime<chrono::Utc>,
}
