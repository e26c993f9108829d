//! The dead-letter table (`kafka_dead_letters`): messages that can never be handled,
//! kept with everything needed to look at them and replay them.
//!
//! A row holds the raw key and payload bytes, why the message was set aside, the error
//! text and the Kafka coordinates. Coordinates are unique per consumer group, so a
//! message dead-lettered again after a redelivery is recorded once.

use sqlx::PgConnection;

use crate::delivery::Delivery;
use crate::fate::Reason;
use crate::schema::Schema;

/// Records `delivery` as dead for `group`. Returns `false` if it was already recorded
/// (a redelivery).
pub(crate) async fn insert(
    conn: &mut PgConnection,
    schema: &Schema,
    group: &str,
    delivery: &Delivery,
    reason: Reason,
    error: &str,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(&format!(
        "INSERT INTO {}
            (consumer_group, topic, kafka_partition, kafka_offset, message_key, payload, reason, error)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (consumer_group, topic, kafka_partition, kafka_offset) DO NOTHING",
        schema.dead_letters()
    ))
    .bind(group)
    .bind(&delivery.topic)
    .bind(delivery.partition)
    .bind(delivery.offset)
    .bind(delivery.key.as_deref())
    .bind(delivery.payload.as_deref())
    .bind(reason.as_str())
    .bind(error)
    .persistent(schema.prepared())
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}
