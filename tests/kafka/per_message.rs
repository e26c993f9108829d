//! Through a real Kafka-API broker, with duplicate sends, malformed messages and one of
//! three consumers killed mid-stream, every business fact is applied to PostgreSQL exactly
//! once, nothing is lost, and the dead letters are exactly the malformed messages
//! (one message per transaction).

use idem_kafka::OffsetStore;

use crate::end_to_end::{
    every_fact_applied_once_despite_a_killed_consumer, through_transaction_pooling,
};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn offsets_in_kafka_every_fact_applied_once_despite_a_killed_consumer(pool: PgPool) {
    every_fact_applied_once_despite_a_killed_consumer(pool, OffsetStore::Kafka, 1).await;
}

#[sqlx::test(migrations = false)]
async fn offsets_in_postgres_every_fact_applied_once_despite_a_killed_consumer(pool: PgPool) {
    every_fact_applied_once_despite_a_killed_consumer(pool, OffsetStore::Postgres, 1).await;
}

#[sqlx::test(migrations = false)]
async fn through_pgbouncer_in_transaction_pooling_every_fact_applied_once_despite_a_killed_consumer(
    pool: PgPool,
) {
    through_transaction_pooling(pool, OffsetStore::Postgres, 1).await;
}
