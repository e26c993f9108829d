//! Why a consumer could not start or stop, and the error texts it records.

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
    /// The consumer's closing task failed.
    #[error("closing the consumer failed: {0}")]
    Close(#[from] tokio::task::JoinError),
}

/// The error and its sources, `: `-separated; a source whose text the message already
/// shows is not repeated.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(error) = source {
        let more = error.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = error.source();
    }
    text
}
