//! What the broker and PostgreSQL say of a consumer group's partitions, whoever holds
//! them: the watermarks of every partition of a topic, and the group's positions (stored
//! in PostgreSQL, or committed to Kafka). Read by a client of its own, which never joins
//! the group: by each member's stall watch, and by [`group_lag`] for operators.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use idem_runtime::Idem;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::error::ConsumerError;
use crate::headway::Watermarks;
use crate::offset_store::OffsetStore;
use crate::schema::Schema;
use crate::store;

/// How long one request to the broker may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of the broker that reads a group's partitions without joining the group.
#[derive(Clone)]
pub(crate) struct GroupView {
    client: Arc<BaseConsumer>,
    topic: String,
}

impl GroupView {
    /// A client for `group`'s view of `topic`; `extra`: librdkafka settings of the
    /// consumer (security, ...), but for those of its membership.
    pub fn new(
        brokers: &str,
        group: &str,
        topic: &str,
        client_id: &str,
        extra: &[(String, String)],
    ) -> KafkaResult<Self> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("client.id", format!("{client_id}-view"))
            .set("enable.auto.commit", "false");
        for (name, value) in extra {
            if !matches!(name.as_str(), "group.instance.id" | "client.id") {
                config.set(name, value);
            }
        }
        Ok(GroupView {
            client: Arc::new(config.create()?),
            topic: topic.to_owned(),
        })
    }

    /// The watermarks of every partition of the topic (blocking: from a blocking task).
    pub fn watermarks(&self) -> KafkaResult<BTreeMap<i32, Watermarks>> {
        let metadata = self
            .client
            .fetch_metadata(Some(&self.topic), BROKER_TIMEOUT)?;
        let mut watermarks = BTreeMap::new();
        for topic in metadata.topics() {
            if topic.name() != self.topic {
                continue;
            }
            for partition in topic.partitions() {
                let (low, high) =
                    self.client
                        .fetch_watermarks(&self.topic, partition.id(), BROKER_TIMEOUT)?;
                watermarks.insert(partition.id(), Watermarks { low, high });
            }
        }
        Ok(watermarks)
    }

    /// The group's committed offsets of `partitions` (blocking).
    pub fn committed(
        &self,
        partitions: impl Iterator<Item = i32>,
    ) -> KafkaResult<HashMap<i32, i64>> {
        let mut list = TopicPartitionList::new();
        for partition in partitions {
            list.add_partition(&self.topic, partition);
        }
        let committed = self.client.committed_offsets(list, BROKER_TIMEOUT)?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|element| match element.offset() {
                Offset::Offset(offset) => Some((element.partition(), offset)),
                _ => None,
            })
            .collect())
    }

    /// The timestamp of the record at each of `starts` (partition, offset): the oldest
    /// record waiting there (blocking; those it cannot read within the broker timeout are
    /// left out).
    pub fn record_times(&self, starts: &[(i32, i64)]) -> KafkaResult<HashMap<i32, i64>> {
        let mut times = HashMap::new();
        if starts.is_empty() {
            return Ok(times);
        }
        let mut list = TopicPartitionList::new();
        for &(partition, offset) in starts {
            list.add_partition_offset(&self.topic, partition, Offset::Offset(offset))?;
        }
        self.client.assign(&list)?;
        let deadline = std::time::Instant::now() + BROKER_TIMEOUT;
        while times.len() < starts.len() && std::time::Instant::now() < deadline {
            let Some(Ok(message)) = self.client.poll(Duration::from_millis(100)) else {
                continue;
            };
            use rdkafka::Message as _;
            let wanted = starts.iter().any(|&(partition, offset)| {
                partition == message.partition() && offset == message.offset()
            });
            if wanted && let Some(at) = message.timestamp().to_millis() {
                times.insert(message.partition(), at);
            }
        }
        self.client.unassign()?;
        Ok(times)
    }

    /// [`watermarks`](Self::watermarks) and, offsets in Kafka, the committed offsets, off
    /// the async runtime.
    pub async fn look(
        &self,
        offsets: OffsetStore,
    ) -> KafkaResult<(BTreeMap<i32, Watermarks>, Option<HashMap<i32, i64>>)> {
        let view = self.clone();
        tokio::task::spawn_blocking(move || {
            let watermarks = view.watermarks()?;
            let committed = match offsets {
                OffsetStore::Kafka => Some(view.committed(watermarks.keys().copied())?),
                OffsetStore::Postgres => None,
            };
            Ok((watermarks, committed))
        })
        .await
        .unwrap_or(Err(rdkafka::error::KafkaError::Canceled))
    }
}

/// One partition of a group's topic, as [`group_lag`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionLag {
    /// The partition.
    pub partition: i32,
    /// The group's position: the next offset to process (`None`: the group has none, and
    /// starts at the first record the broker has).
    pub position: Option<i64>,
    /// The first offset the broker still has.
    pub low_watermark: i64,
    /// The offset after the partition's last record.
    pub high_watermark: i64,
    /// Records behind the position.
    pub lag: i64,
    /// When the stored position last moved (offsets in PostgreSQL; `None` in Kafka).
    pub moved_at: Option<DateTime<Utc>>,
    /// With lag: the timestamp of the oldest record waiting (the one at the position), as
    /// its producer or the broker stamped it (`None` without lag, or when it could not be
    /// read). A position that has not moved for long is stalled only if records have
    /// waited that long: a record that just arrived on an idle partition has not.
    pub waiting_since: Option<DateTime<Utc>>,
}

/// The lag of consumer `group` on every partition of `topic`: the broker's watermarks
/// beside the group's positions, stored in PostgreSQL (in the tables of `schema`) or
/// committed to Kafka, whichever `offsets` says the group keeps. What `idem lag` shows.
///
/// A partition whose position does not move while it has lag is stalled, whoever holds
/// it (or nobody does).
pub async fn group_lag(
    idem: &Idem,
    schema: &Schema,
    brokers: &str,
    group: &str,
    topic: &str,
    offsets: OffsetStore,
) -> Result<Vec<PartitionLag>, ConsumerError> {
    let view = GroupView::new(brokers, group, topic, &format!("{group}-lag"), &[])?;
    let (watermarks, committed) = view.look(offsets).await?;
    let stored: HashMap<i32, (i64, DateTime<Utc>)> = match offsets {
        OffsetStore::Postgres => {
            let schema = schema.clone().behind(idem);
            let mut conn = idem.pool().acquire().await?;
            store::alone(&mut conn, &schema, async |conn| {
                store::stored_positions_moved(conn, &schema, group, topic).await
            })
            .await?
        }
        OffsetStore::Kafka => HashMap::new(),
    };
    let mut lags: Vec<PartitionLag> = watermarks
        .into_iter()
        .map(|(partition, marks)| {
            let (position, moved_at) = match &committed {
                Some(committed) => (committed.get(&partition).copied(), None),
                None => match stored.get(&partition) {
                    Some(&(next, at)) => (Some(next), Some(at)),
                    None => (None, None),
                },
            };
            let from = position.unwrap_or(marks.low).max(marks.low);
            PartitionLag {
                partition,
                position,
                low_watermark: marks.low,
                high_watermark: marks.high,
                lag: (marks.high - from).max(0),
                moved_at,
                waiting_since: None,
            }
        })
        .collect();
    let starts: Vec<(i32, i64)> = lags
        .iter()
        .filter(|lag| lag.lag > 0)
        .map(|lag| {
            let from = lag
                .position
                .unwrap_or(lag.low_watermark)
                .max(lag.low_watermark);
            (lag.partition, from)
        })
        .collect();
    let times = tokio::task::spawn_blocking(move || view.record_times(&starts))
        .await
        .unwrap_or(Err(rdkafka::error::KafkaError::Canceled))?;
    for lag in &mut lags {
        lag.waiting_since = times
            .get(&lag.partition)
            .and_then(|&at| DateTime::<Utc>::from_timestamp_millis(at));
    }
    Ok(lags)
}
