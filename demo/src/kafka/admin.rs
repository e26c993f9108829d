//! Topic administration and broker checks over the Kafka protocol.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Waits until the broker answers a metadata request, for at most `timeout`.
pub async fn wait_for_broker(brokers: &str, timeout: Duration) -> Result<(), KafkaError> {
    let client = metadata_client(brokers)?;
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + timeout;
        loop {
            match client.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    })
    .await
    .expect("the metadata task does not panic")
}

/// Creates `topic` with `partitions` partitions (replication factor 1) unless it exists,
/// and waits until its metadata shows every partition.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&new_topic], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                tracing::error!(topic = name, %code, "creating the topic failed");
                return Err(KafkaError::AdminOp(code));
            }
        }
    }
    let client = metadata_client(brokers)?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let metadata = client.fetch_metadata(Some(&topic), Duration::from_secs(5))?;
            let ready = metadata.topics().iter().any(|t| {
                t.name() == topic
                    && t.error().is_none()
                    && t.partitions().len() >= partitions as usize
            });
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .expect("the metadata task does not panic")
}

/// The offset after the last message of each partition of `topic` (the high watermarks).
pub async fn end_offsets(brokers: &str, topic: &str) -> Result<HashMap<i32, i64>, KafkaError> {
    let client = metadata_client(brokers)?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let metadata = client.fetch_metadata(Some(&topic), Duration::from_secs(5))?;
        let mut ends = HashMap::new();
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (_, high) =
                client.fetch_watermarks(&topic, partition.id(), Duration::from_secs(5))?;
            ends.insert(partition.id(), high);
        }
        Ok(ends)
    })
    .await
    .expect("the metadata task does not panic")
}

fn metadata_client(brokers: &str) -> Result<BaseConsumer, KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("socket.timeout.ms", "3000")
        .create()
}
