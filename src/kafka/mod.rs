//! Kafka-to-PostgreSQL consumption of order events through `#[idempotent]` handlers.
//!
//! The pieces, each usable on its own:
//!
//! - [`handlers`]: the business handlers (`#[idempotent(key = "event_key", ...)]`) and the
//!   tables they write;
//! - [`consumer`]: a consumer-group member that hands every message (or batch of messages)
//!   to a handler, commits offsets only after the handler's transaction committed,
//!   dead-letters what can never succeed and waits out database outages without skipping
//!   a message;
//! - [`notifications`]: the side-effect consumer's handler, in lease mode, and the
//!   stand-in external notification service it calls;
//! - [`offsets`]: the stronger variant that stores offsets in PostgreSQL, in the same
//!   transaction as the effects;
//! - [`dead_letter`]: the dead-letter table;
//! - [`producer`]: order events with duplicate sends and malformed messages, as the demo,
//!   the examples and the tests publish them;
//! - [`admin`]: topic creation and broker checks;
//! - [`broker`]: finding or starting a local `tansu` broker for the tests;
//! - [`verify`]: the SQL check that every business fact was applied exactly once.

pub mod admin;
pub mod broker;
pub mod consumer;
pub mod dead_letter;
pub mod handlers;
pub mod notifications;
pub mod offsets;
pub mod producer;
pub mod verify;

use sqlx::PgPool;

/// The default broker address of the examples (`KAFKA_BROKERS` overrides it).
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// Creates the business tables, the offset table and the dead-letter table if they are
/// missing. Safe to call from every consumer at start-up (serialised by an advisory lock).
///
/// The status table of idem is created separately, by [`idem_runtime::Idem::migrate`].
pub async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Concurrent `CREATE TABLE IF NOT EXISTS` of one table can fail on the catalog's
    // unique index: serialise the consumers that start together.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem-suite kafka tables'))")
        .execute(&mut *tx)
        .await?;
    for statement in [
        crate::orders::CREATE_ORDER_EFFECTS,
        handlers::CREATE_ORDER_TOTALS,
        offsets::CREATE_KAFKA_OFFSETS,
        dead_letter::CREATE_KAFKA_DEAD_LETTERS,
    ] {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Where a message was read: its topic, partition and offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Coordinates {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The message's offset in the partition.
    pub offset: i64,
}

/// A message taken off the consumer, owned, so that it can outlive the consumer's buffer
/// (retries, a batch of several messages).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Where it was read.
    pub at: Coordinates,
    /// The Kafka message key, if any.
    pub key: Option<Vec<u8>>,
    /// The payload, if any.
    pub payload: Option<Vec<u8>>,
}

impl Delivery {
    /// Copies a message received from rdkafka.
    pub fn from_message<M: rdkafka::Message>(message: &M) -> Self {
        Delivery {
            at: Coordinates {
                topic: message.topic().to_owned(),
                partition: message.partition(),
                offset: message.offset(),
            },
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
        }
    }
}

/// Completes on Ctrl-C or, on Unix, SIGTERM: the graceful-shutdown trigger of the examples.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                tokio::signal::ctrl_c().await.ok();
            }
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.ok();
    }
}

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` or else by `default_filter`
/// (e.g. `"info"`).
pub fn init_tracing(default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
