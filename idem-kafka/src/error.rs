//! Why a consumer could not start or stop.

use rdkafka::error::KafkaError;

/// Why a consumer could not start or stop cleanly. Failures of single messages never end
/// up here: they are retried or dead-lettered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The Kafka client failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// PostgreSQL failed (at start-up, or applying the migrations).
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    /// The migrations of idem-kafka's tables failed.
    #[error("migrating idem-kafka's tables: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The settings are not usable.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The member made no headway and rejoining its group did not help (the broker does
    /// not assign it the partitions that wait): it stopped, for its supervisor to start it
    /// again. The text says which partitions and for how long.
    #[error("the consumer stopped making headway: {0}")]
    Stalled(String),
    /// The consumer's closing task failed, or the member's task was cancelled (its
    /// runtime shutting down).
    #[error("closing the consumer failed: {0}")]
    Close(#[from] tokio::task::JoinError),
}
