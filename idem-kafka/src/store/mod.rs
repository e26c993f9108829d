//! The store: the only code with SQL on idem-kafka's own tables, in the schema of a
//! [`Schema`] (see the crate's migrations).
//!
//! - `kafka_offsets`: consumer offsets stored in PostgreSQL, next to the effects they
//!   stand for ([`OffsetStore::Postgres`](crate::OffsetStore::Postgres)). The handler's
//!   transaction writes the business effects, the key's `success` and the partition's
//!   next offset, and commits them together; on partition assignment the consumer starts
//!   from the stored offset, so after a crash it re-reads at most the messages whose
//!   transaction had not committed yet, plus the duplicates and dead letters read since
//!   the last flush. Positions only move forward.
//! - `kafka_dead_letters`: messages that can never be handled, with the raw key and
//!   payload bytes, why they were set aside, the error text and their coordinates.
//!   Coordinates are unique per consumer group, so a message dead-lettered again after a
//!   redelivery is recorded once.
//! - `kafka_outbox` and `kafka_outbox_relays`: records sent from handlers' transactions,
//!   and which relay publishes which shard of them ([`outbox`]).

pub(crate) mod outbox;

use std::collections::HashMap;

use idem_runtime::{Idem, storable_text_of};
use sqlx::{Connection, PgConnection};

use crate::dead_letter::DeadLetter;
use crate::delivery::Delivery;
use crate::fate::Reason;
use crate::position_behind::PositionBehind;
use crate::progress::PositionRow;
use crate::schema::Schema;

fn offsets_table(schema: &Schema) -> String {
    format!("{}.kafka_offsets", schema.as_str())
}

fn dead_letters_table(schema: &Schema) -> String {
    format!("{}.kafka_dead_letters", schema.as_str())
}

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

/// Records several positions of one group in one statement (forward only), each guarded
/// by its floor: a stored position below the floor (or no row where the floor says one
/// was committed) means the database lost commits. Such a position is not written, and
/// the error ([`PositionBehind`], in [`sqlx::Error::Io`]) rolls back the transaction it
/// was written in: a handler's effects must not commit past messages whose effects were
/// lost.
pub(crate) async fn store_positions(
    conn: &mut PgConnection,
    schema: &Schema,
    group: &str,
    positions: &[PositionRow],
) -> Result<(), sqlx::Error> {
    if positions.is_empty() {
        return Ok(());
    }
    let table = offsets_table(schema);
    // Nothing is written where the floor says a row was committed and there is none, nor
    // where the row is below the floor: such rows are not returned, and the statement
    // writes nothing for them even outside a transaction (autocommit).
    let written: Vec<(String, i32)> = match positions {
        // One position (a message per transaction): a statement of scalars, which
        // PostgreSQL plans once per connection. Over arrays it plans the statement again
        // at every execution (a custom plan, as it knows the arrays' lengths then).
        [row] => {
            sqlx::query_as(&format!(
                "INSERT INTO {table} AS o (consumer_group, topic, kafka_partition, next_offset)
                 SELECT $1::text, $2::text, $3::int, $4::bigint
                 WHERE $5::bigint <= 0 OR EXISTS (
                     SELECT 1 FROM {table} AS s
                     WHERE s.consumer_group = $1 AND s.topic = $2 AND s.kafka_partition = $3)
                 ON CONFLICT (consumer_group, topic, kafka_partition) DO UPDATE
                 SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
                     updated_at = now()
                 WHERE o.next_offset >= $5
                 RETURNING topic, kafka_partition"
            ))
            .bind(group)
            .bind(&row.topic)
            .bind(row.partition)
            .bind(row.next_offset)
            .bind(row.floor)
            .persistent(schema.prepared())
            .fetch_all(&mut *conn)
            .await?
        }
        // In the order of their keys: two transactions storing positions of the same
        // partitions lock their rows in one order.
        _ => {
            let topics: Vec<&str> = positions.iter().map(|row| row.topic.as_str()).collect();
            let partitions: Vec<i32> = positions.iter().map(|row| row.partition).collect();
            let offsets: Vec<i64> = positions.iter().map(|row| row.next_offset).collect();
            let floors: Vec<i64> = positions.iter().map(|row| row.floor).collect();
            sqlx::query_as(&format!(
                "INSERT INTO {table} AS o (consumer_group, topic, kafka_partition, next_offset)
                 SELECT $1, topic, kafka_partition, next_offset
                 FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[])
                     AS p(topic, kafka_partition, next_offset, floor)
                 WHERE p.floor <= 0 OR EXISTS (
                     SELECT 1 FROM {table} AS s
                     WHERE s.consumer_group = $1 AND s.topic = p.topic AND s.kafka_partition = p.kafka_partition)
                 ORDER BY topic, kafka_partition
                 ON CONFLICT (consumer_group, topic, kafka_partition) DO UPDATE
                 SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
                     updated_at = now()
                 WHERE o.next_offset >= (
                     SELECT f.floor FROM unnest($2::text[], $3::int[], $5::bigint[]) AS f(topic, kafka_partition, floor)
                     WHERE f.topic = o.topic AND f.kafka_partition = o.kafka_partition LIMIT 1)
                 RETURNING topic, kafka_partition"
            ))
            .bind(group)
            .bind(&topics)
            .bind(&partitions)
            .bind(&offsets)
            .bind(&floors)
            .persistent(schema.prepared())
            .fetch_all(&mut *conn)
            .await?
        }
    };
    for row in positions {
        let written = written
            .iter()
            .any(|(topic, partition)| *topic == row.topic && *partition == row.partition);
        if !written {
            let stored = stored_offset(conn, schema, group, &row.topic, row.partition)
                .await
                .unwrap_or(None);
            return Err(PositionBehind {
                topic: row.topic.clone(),
                partition: row.partition,
                stored,
                known: row.floor,
            }
            .into_sqlx());
        }
    }
    Ok(())
}

/// The stored next offset of `group` in one partition, for an error's text.
async fn stored_offset(
    conn: &mut PgConnection,
    schema: &Schema,
    group: &str,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(&format!(
        "SELECT next_offset FROM {} WHERE consumer_group = $1 AND topic = $2 AND kafka_partition = $3",
        offsets_table(schema)
    ))
    .bind(group)
    .bind(topic)
    .bind(partition)
    .persistent(schema.prepared())
    .fetch_optional(conn)
    .await
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
    Ok(stored_positions_moved(conn, schema, group, topic)
        .await?
        .into_iter()
        .map(|(partition, (next, _))| (partition, next))
        .collect())
}

/// The stored next offsets of `group` in `topic`, by partition, with when each was last
/// written.
pub(crate) async fn stored_positions_moved(
    conn: &mut PgConnection,
    schema: &Schema,
    group: &str,
    topic: &str,
) -> Result<HashMap<i32, (i64, chrono::DateTime<chrono::Utc>)>, sqlx::Error> {
    let rows: Vec<(i32, i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(&format!(
        "SELECT kafka_partition, next_offset, updated_at FROM {} WHERE consumer_group = $1 AND topic = $2",
        offsets_table(schema)
    ))
    .bind(group)
    .bind(topic)
    .persistent(schema.prepared())
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(partition, next, at)| (partition, (next, at)))
        .collect())
}

/// The longest error text a dead letter records, in bytes. PostgreSQL's `text` refuses
/// NUL characters (an error quoting a hostile payload may carry one), and a refused insert
/// would leave the message undecided and redelivered forever: the text is stored as
/// [`storable_text_of`] makes it.
const MAX_DEAD_LETTER_ERROR: usize = 4096;

/// Records `delivery` as dead for `group`. Returns `false` if it was already recorded
/// (a redelivery).
pub(crate) async fn insert_dead_letter(
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
        dead_letters_table(schema)
    ))
    .bind(group)
    .bind(&delivery.topic)
    .bind(delivery.partition)
    .bind(delivery.offset)
    .bind(delivery.key.as_deref())
    .bind(delivery.payload.as_deref())
    .bind(reason.as_str())
    .bind(storable_text_of(error, MAX_DEAD_LETTER_ERROR))
    .persistent(schema.prepared())
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// A row of `kafka_dead_letters`, as selected by [`dead_letters`].
type DeadLetterRow = (
    String,
    String,
    i32,
    i64,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    String,
    String,
    chrono::DateTime<chrono::Utc>,
);

/// The dead letters of consumer group `group`, kept in the tables of `schema`, by topic,
/// partition and offset: the messages the group's consumers set aside as never
/// handleable ([`Fate::DeadLetter`](crate::Fate::DeadLetter), or undecodable), to look at
/// and replay.
///
/// `schema` is the one the consumers were built with: [`Schema::for_idem`] by default, or
/// [`Consumer::schema`](crate::Consumer::schema). The table keeps every dead letter until
/// it is deleted, and all of the group's are returned.
///
/// ```no_run
/// # async fn f(idem: idem_runtime::Idem) -> Result<(), sqlx::Error> {
/// use idem_kafka::Schema;
///
/// for dead in idem_kafka::dead_letters(&idem, &Schema::for_idem(&idem), "order-appliers").await? {
///     println!("{}/{}@{}: {} ({})", dead.topic, dead.partition, dead.offset, dead.reason, dead.error);
/// }
/// # Ok(()) }
/// ```
pub async fn dead_letters(
    idem: &Idem,
    schema: &Schema,
    group: &str,
) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let schema = schema.clone().behind(idem);
    let mut conn = idem.pool().acquire().await?;
    let rows: Vec<DeadLetterRow> = alone(&mut conn, &schema, async |conn| {
        sqlx::query_as(&format!(
            "SELECT consumer_group, topic, kafka_partition, kafka_offset, message_key, payload,
                    reason, error, created_at
             FROM {} WHERE consumer_group = $1
             ORDER BY topic, kafka_partition, kafka_offset",
            dead_letters_table(&schema)
        ))
        .bind(group)
        .persistent(schema.prepared())
        .fetch_all(conn)
        .await
    })
    .await?;
    rows.into_iter()
        .map(
            |(group, topic, partition, offset, key, payload, reason, error, recorded_at)| {
                // A reason that a later release wrote and this one does not know: the
                // message can never be handled all the same.
                let known = Reason::from_column(&reason).unwrap_or(Reason::Unrecoverable);
                Ok(DeadLetter {
                    group,
                    topic,
                    partition,
                    offset,
                    key,
                    payload,
                    reason: known,
                    stored_reason: reason,
                    error,
                    recorded_at,
                })
            },
        )
        .collect()
}
