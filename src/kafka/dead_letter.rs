//! The dead-letter table: messages that can never be applied, kept with everything needed
//! to look at them and replay them.
//!
//! A row holds the raw key and payload bytes, why the message was set aside, the error
//! text and the Kafka coordinates. Coordinates are unique per consumer group, so a
//! message dead-lettered again after a redelivery (a crash before the offset commit) is
//! recorded once.

use sqlx::PgConnection;

use super::Delivery;

/// The dead-letter table.
pub const CREATE_KAFKA_DEAD_LETTERS: &str = "CREATE TABLE IF NOT EXISTS kafka_dead_letters (
    id bigserial PRIMARY KEY,
    consumer_group text NOT NULL,
    topic text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset bigint NOT NULL,
    message_key bytea,
    payload bytea,
    reason text NOT NULL,
    error text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer_group, topic, kafka_partition, kafka_offset)
)";

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The payload is not an order event (bad JSON, unknown fields' values, no payload).
    Undecodable,
    /// The idempotency key cannot be derived: a key field is missing
    /// ([`idem_runtime::Error::Key`]).
    MissingKey,
    /// The key was first applied with another payload
    /// ([`idem_runtime::Error::PayloadMismatch`]).
    PayloadMismatch,
    /// The handler failed `max_attempts` times and the key is parked
    /// ([`idem_runtime::Error::Parked`], or the failure that parked it).
    Parked,
    /// Any other error that retrying cannot fix (a stored result that no longer decodes).
    Unrecoverable,
}

impl Reason {
    /// The reason as stored in the `reason` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Undecodable => "undecodable",
            Reason::MissingKey => "missing_key",
            Reason::PayloadMismatch => "payload_mismatch",
            Reason::Parked => "parked",
            Reason::Unrecoverable => "unrecoverable",
        }
    }

    /// The reason for an error whose disposition is dead-letter.
    pub fn of<E>(error: &idem_runtime::Error<E>) -> Self {
        use idem_runtime::Error;
        match error {
            Error::Key(_) => Reason::MissingKey,
            Error::PayloadMismatch { .. } => Reason::PayloadMismatch,
            Error::Parked { .. } | Error::Handler { parked: true, .. } => Reason::Parked,
            _ => Reason::Unrecoverable,
        }
    }
}

/// Records `delivery` as dead for `group`. Returns `false` if it was already recorded
/// (a redelivery).
pub async fn insert(
    conn: &mut PgConnection,
    group: &str,
    delivery: &Delivery,
    reason: Reason,
    error: &str,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO kafka_dead_letters
            (consumer_group, topic, kafka_partition, kafka_offset, message_key, payload, reason, error)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (consumer_group, topic, kafka_partition, kafka_offset) DO NOTHING",
    )
    .bind(group)
    .bind(&delivery.at.topic)
    .bind(delivery.at.partition)
    .bind(delivery.at.offset)
    .bind(delivery.key.as_deref())
    .bind(delivery.payload.as_deref())
    .bind(reason.as_str())
    .bind(error)
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}
