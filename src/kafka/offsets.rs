//! Consumer offsets stored in PostgreSQL, next to the effects they stand for.
//!
//! In this variant the handler's transaction writes the business effects, the key's
//! `success` and the partition's next offset, and commits them together. On partition
//! assignment the consumer starts from the stored offset, so after a crash it re-reads at
//! most the messages whose transaction had not committed yet, plus the duplicates and
//! dead letters read since the last flush (they write no business rows and are recorded
//! here every commit interval): redelivery is bounded by construction, not by how often
//! the consumer committed to Kafka.
//!
//! On the batch path, [`BatchOffsets`] stores, in the batch transaction, each partition's
//! position up to the first message of the batch that is not done when it commits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_runtime::{Idem, IdempotencyKey};
use sqlx::PgConnection;
use uuid::Uuid;

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

/// The positions of a batch, stored by the batch transaction itself: the extra parameter
/// of [`apply_order_event_at_offsets`](super::handlers::apply_order_event_at_offsets).
///
/// Storing the last message's position would not do. The body runs only for the new
/// messages, so the last message of a partition (a duplicate) may run none; and the batch
/// transaction commits before the consumer routes the verdicts, so a message in the middle
/// that is to be dead-lettered (a payload mismatch, a parked key, a missing key) or
/// retried (a key in progress elsewhere) is not done when it commits. A position past it
/// would lose it after a crash.
///
/// So the first body that runs in a transaction stores, in one statement, each
/// partition's position *up to the first message of the batch that is not done* as that
/// transaction sees the status table: done are the messages whose key is `success` with
/// their own payload fingerprint, the ones this transaction claimed as well as duplicates
/// of keys committed before. If the batch commits, every message below the stored
/// position is done; if it rolls back, nothing was stored. Positions only move forward.
///
/// The later bodies of the same transaction do not store again. A body that fails calls
/// [`forget`](Self::forget): the batch is rolled back and run again one message per
/// transaction, and the first of those transactions stores the positions again. (When a
/// batch rolls back for another reason, a failed commit, the positions wait for the
/// consumer's next flush: later, never wrong.)
#[derive(Debug)]
pub struct BatchOffsets {
    group: String,
    status_table: String,
    scope: &'static str,
    topics: Vec<String>,
    partitions: Vec<i32>,
    next_offsets: Vec<i64>,
    keys: Vec<Option<Uuid>>,
    fingerprints: Vec<Option<Vec<u8>>>,
    stored: AtomicBool,
}

impl BatchOffsets {
    /// No positions yet, for the handler scope `scope` of `idem`'s status table.
    pub fn new(idem: &Idem, scope: &'static str, group: impl Into<String>) -> Self {
        BatchOffsets {
            group: group.into(),
            status_table: format!("{}.idem_keys", idem.config().schema()),
            scope,
            topics: Vec::new(),
            partitions: Vec::new(),
            next_offsets: Vec::new(),
            keys: Vec::new(),
            fingerprints: Vec::new(),
            stored: AtomicBool::new(false),
        }
    }

    /// Adds a message of the batch: its position after it, and its key and payload
    /// fingerprint as the handler derives them (`None` when the key cannot be derived: the
    /// message is not done).
    pub fn push(&mut self, position: &Position, key: Option<(IdempotencyKey, [u8; 32])>) {
        self.topics.push(position.topic.clone());
        self.partitions.push(position.partition);
        self.next_offsets.push(position.next_offset);
        self.keys.push(key.map(|(key, _)| key.as_uuid()));
        self.fingerprints
            .push(key.map(|(_, fingerprint)| fingerprint.to_vec()));
    }

    /// Stores the positions (see above) unless a body of this transaction did already.
    pub async fn store_once(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.stored.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        sqlx::query(&format!(
            "WITH batch AS (
                SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::uuid[], $6::bytea[])
                    AS b(topic, kafka_partition, next_offset, key, fingerprint)
            ), checked AS (
                SELECT b.topic, b.kafka_partition, b.next_offset,
                       coalesce(k.status = 'success' AND (k.fingerprint IS NULL OR b.fingerprint IS NULL
                                OR k.fingerprint = b.fingerprint), false) AS done
                FROM batch b LEFT JOIN {} k ON k.scope = $7 AND k.key = b.key
            ), reached AS (
                SELECT topic, kafka_partition,
                       coalesce(min(next_offset - 1) FILTER (WHERE NOT done), max(next_offset)) AS next_offset
                FROM checked GROUP BY topic, kafka_partition
            )
            INSERT INTO kafka_offsets (consumer_group, topic, kafka_partition, next_offset)
            SELECT $1, topic, kafka_partition, next_offset FROM reached ORDER BY topic, kafka_partition
            ON CONFLICT (consumer_group, topic, kafka_partition) DO UPDATE
            SET next_offset = GREATEST(kafka_offsets.next_offset, EXCLUDED.next_offset),
                updated_at = now()",
            self.status_table
        ))
        .bind(&self.group)
        .bind(&self.topics)
        .bind(&self.partitions)
        .bind(&self.next_offsets)
        .bind(&self.keys)
        .bind(&self.fingerprints)
        .bind(self.scope)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// A body failed and its transaction rolls back: the next transaction stores again.
    pub fn forget(&self) {
        self.stored.store(false, Ordering::SeqCst);
    }
}
