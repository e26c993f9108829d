//! Consumer offsets stored in PostgreSQL, next to the effects they stand for.
//!
//! In this variant the handler's transaction writes the business effects, the key's
//! `success` and the partition's next offset, and commits them together. On partition
//! assignment the consumer starts from the stored offset, so after a crash it re-reads at
//! most the messages whose transaction had not committed yet, plus the duplicates and
//! dead letters read since the last flush (they write no business rows and are recorded
//! here every commit interval): redelivery is bounded by construction, not by how often
//! the consumer committed to Kafka.

use std::collections::HashMap;

use sqlx::PgConnection;

/// The offset table: one row per consumer group and partition.
pub const CREATE_KAFKA_OFFSETS: &str = "CREATE TABLE IF NOT EXISTS kafka_offsets (
    consumer_group text NOT NULL,
    topic text NOT NULL,
    kafka_partition integer NOT NULL,
    next_offset bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, kafka_partition)
)";

/// The position of a consumer group in a partition after one message: the offset to read
/// next. The extra parameter of [`apply_order_event_at`](super::handlers::apply_order_event_at).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The consumer group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset to read next (the message's offset + 1).
    pub next_offset: i64,
}

impl Position {
    /// Records the position on `conn`, typically inside the handler's transaction.
    ///
    /// Positions only move forward: a late write of an older position (a consumer that
    /// lost the partition finishing its last message) leaves a newer one in place.
    pub async fn store(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO kafka_offsets (consumer_group, topic, kafka_partition, next_offset)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (consumer_group, topic, kafka_partition) DO UPDATE
             SET next_offset = GREATEST(kafka_offsets.next_offset, EXCLUDED.next_offset),
                 updated_at = now()",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(self.partition)
        .bind(self.next_offset)
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// Records several positions of one group in one statement (forward only).
pub async fn store_all(
    conn: &mut PgConnection,
    group: &str,
    positions: &[(String, i32, i64)],
) -> Result<(), sqlx::Error> {
    if positions.is_empty() {
        return Ok(());
    }
    let topics: Vec<&str> = positions
        .iter()
        .map(|(topic, _, _)| topic.as_str())
        .collect();
    let partitions: Vec<i32> = positions
        .iter()
        .map(|(_, partition, _)| *partition)
        .collect();
    let offsets: Vec<i64> = positions.iter().map(|(_, _, offset)| *offset).collect();
    sqlx::query(
        "INSERT INTO kafka_offsets (consumer_group, topic, kafka_partition, next_offset)
         SELECT $1, topic, kafka_partition, next_offset
         FROM unnest($2::text[], $3::int[], $4::bigint[]) AS p(topic, kafka_partition, next_offset)
         ON CONFLICT (consumer_group, topic, kafka_partition) DO UPDATE
         SET next_offset = GREATEST(kafka_offsets.next_offset, EXCLUDED.next_offset),
             updated_at = now()",
    )
    .bind(group)
    .bind(&topics)
    .bind(&partitions)
    .bind(&offsets)
    .execute(conn)
    .await?;
    Ok(())
}

/// The stored next offsets of `group` in `topic`, by partition. Partitions without a row
/// are absent (the consumer then starts where Kafka's committed offset or
/// `auto.offset.reset` says).
pub async fn load(
    conn: &mut PgConnection,
    group: &str,
    topic: &str,
) -> Result<HashMap<i32, i64>, sqlx::Error> {
    let rows: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT kafka_partition, next_offset FROM kafka_offsets WHERE consumer_group = $1 AND topic = $2",
    )
    .bind(group)
    .bind(topic)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}
