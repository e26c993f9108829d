//! On the batch path (up to 100 or 500 messages per transaction), through a real Kafka-API
//! broker, with duplicate sends (also inside one batch), malformed messages (a failing
//! handler inside a batch among them) and one of three consumers killed mid-stream, every
//! business fact is applied to PostgreSQL exactly once, nothing is lost, and the dead
//! letters are exactly the malformed messages.

use idem_kafka::OffsetStore;

use crate::end_to_end::every_fact_applied_once_despite_a_killed_consumer;
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn batches_of_100_offsets_in_kafka_every_fact_applied_once_despite_a_killed_consumer(
    pool: PgPool,
) {
    every_fact_applied_once_despite_a_killed_consumer(pool, OffsetStore::Kafka, 100).await;
}

#[sqlx::test(migrations = false)]
async fn batches_of_500_offsets_in_postgres_every_fact_applied_once_despite_a_killed_consumer(
    pool: PgPool,
) {
    every_fact_applied_once_despite_a_killed_consumer(pool, OffsetStore::Postgres, 500).await;
}
