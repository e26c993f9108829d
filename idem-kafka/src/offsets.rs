//! Consumer offsets stored in PostgreSQL (`kafka_offsets`), next to the effects they
//! stand for.
//!
//! In this variant the handler's transaction writes the business effects, the key's
//! `success` and the partition's next offset, and commits them together. On partition
//! assignment the consumer starts from the stored offset, so after a crash it re-reads at
//! most the messages whose transaction had not committed yet, plus the duplicates and
//! dead letters read since the last flush.

use std::collections::HashMap;

use sqlx::{Connection, PgConnection};

use crate::schema::Schema;

/// Runs `job` on `conn` outside the handler's transaction. Behind a transaction pooler it
/// runs in a transaction of its own: sqlx parses a statement in one round trip and binds
/// it in the next, and only an open transaction keeps the two on one server connection.
pub(crate) async fn alone<T>(
    conn: &mut PgConnection,
    schema: &Schema,
    job: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    if schema.prepared() {
        return job(conn).await;
    }
    let mut tx = conn.begin().await?;
    let value = job(&mut tx).await?;
    tx.commit().await?;
    Ok(value)
}

/// Records several positions of one group in one statement (forward only).
pub(crate) async fn store_all(
    conn: &mut PgConnection,
    schema: &Schema,
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
    let table = schema.offsets();
    sqlx::query(&format!(
        "INSERT INTO {table} AS o (consumer_group, topic, kafka_partition, next_offset)
         SELECT $1, topic, kafka_partition, next_offset
         FROM unnest($2::text[], $3::int[], $4::bigint[]) AS p(topic, kafka_partition, next_offset)
         ORDER BY topic, kafka_partition
         ON CONFLICT (consumer_group, topic, kafka_partition) DO UPDATE
         SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
             updated_at = now()"
    ))
    .bind(group)
    .bind(&topics)
    .bind(&partitions)
    .bind(&offsets)
    .persistent(schema.prepared())
    .execute(conn)
    .await?;
    Ok(())
}

/// The stored next offsets of `group` in `topic`, by partition. Partitions without a row
/// are absent (the consumer then starts where Kafka's committed offset or
/// `auto.offset.reset` says).
pub async fn stored_offsets(
    conn: &mut PgConnection,
    schema: &Schema,
    group: &str,
    topic: &str,
) -> Result<HashMap<i32, i64>, sqlx::Error> {
    let rows: Vec<(i32, i64)> = sqlx::query_as(&format!(
        "SELECT kafka_partition, next_offset FROM {} WHERE consumer_group = $1 AND topic = $2",
        schema.offsets()
    ))
    .bind(group)
    .bind(topic)
    .persistent(schema.prepared())
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}
