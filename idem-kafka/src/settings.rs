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
    /// `None`: twice the session timeout.
    pub stall_bound: Option<Duration>,
    /// `None`: the pool's size less two.
    pub max_in_flight: Option<usize>,
    pub schema: Option<Schema>,
    pub extra: Vec<(String, String)>,
}

impl Settings {
    /// How long a partition with lag may stand still before it counts as stalled: as set,
    /// or twice the session timeout and at least 30 s (a broker expels a silent member
    /// only after its session, and a rejoin before then hands its partitions back to it;
    /// a group that is still forming, its members joining one after another, needs a few
    /// rebalances first).
    pub fn stall_bound(&self) -> Duration {
        self.stall_bound
            .unwrap_or((self.session_timeout * 2).max(Duration::from_secs(30)))
    }

    /// How many deliveries the member works at once, with a pool of `pool_size`
    /// connections: as set, or the pool's size less two (the member's flushes, its stall
    /// watch and its dead letters take connections of their own now and then); at least
    /// 1, at most the pool's size (a delivery in flight holds a connection).
    pub fn max_in_flight(&self, pool_size: u32) -> usize {
        let pool_size = (pool_size as usize).max(1);
        match self.max_in_flight {
            Some(set) if set > pool_size => {
                tracing::warn!(
                    max_in_flight = set,
                    pool_size,
                    "max_in_flight is above the size of idem's pool: working {pool_size} deliveries at once"
                );
                pool_size
            }
            Some(set) => set.max(1),
            None => pool_size.saturating_sub(2).max(1),
        }
    }

    /// The heartbeat interval: a quarter of the session, at most 3 s (a member learns of a
    /// rebalance from its heartbeat).
    pub fn heartbeat_interval(&self) -> Duration {
        (self.session_timeout / 4).min(Duration::from_secs(3))
    }

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
            session_timeout: Duration::from_secs(30),
            stall_bound: None,
            max_in_flight: None,
            schema: None,
            extra: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Settings;

    #[test]
    fn deliveries_at_once_stay_within_the_pool() {
        let mut settings = Settings::new("b".into(), "g".into(), "t".into());
        assert_eq!(settings.max_in_flight(10), 8);
        assert_eq!(settings.max_in_flight(2), 1);
        assert_eq!(settings.max_in_flight(0), 1);
        settings.max_in_flight = Some(6);
        assert_eq!(settings.max_in_flight(10), 6);
        assert_eq!(settings.max_in_flight(4), 4);
        settings.max_in_flight = Some(0);
        assert_eq!(settings.max_in_flight(10), 1);
    }
}
