//! The settings of one consumer, and their defaults.

use std::time::Duration;

use crate::offset_store::OffsetStore;
use crate::schema::Schema;

/// The settings of one consumer, as [`ConsumerBuilder`](crate::ConsumerBuilder) takes them.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub brokers: String,
    pub group: String,
    pub topic: String,
    pub client_id: String,
    pub offsets: OffsetStore,
    pub batch_size: usize,
    pub batch_linger: Duration,
    pub commit_interval: Duration,
    pub retry_backoff: Duration,
    pub max_retry_backoff: Duration,
    pub session_timeout: Duration,
    pub stall_bound: Duration,
    pub schema: Option<Schema>,
    pub extra: Vec<(String, String)>,
}

impl Settings {
    /// The defaults for a member of `group` reading `topic` from `brokers`.
    pub fn new(brokers: String, group: String, topic: String) -> Self {
        Settings {
            brokers,
            client_id: format!("{group}-member"),
            group,
            topic,
            offsets: OffsetStore::Kafka,
            batch_size: 1,
            batch_linger: Duration::from_millis(20),
            commit_interval: Duration::from_secs(1),
            retry_backoff: Duration::from_millis(50),
            max_retry_backoff: Duration::from_secs(5),
            session_timeout: Duration::from_secs(10),
            stall_bound: Duration::from_secs(30),
            schema: None,
            extra: Vec::new(),
        }
    }
}
