//! A message taken off the consumer.

/// A message taken off the consumer, owned, so that it can outlive the consumer's buffer
/// (retries, a batch of several messages).
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
}

impl Delivery {
    /// Copies a message received from rdkafka.
    pub fn from_message<M: rdkafka::Message>(message: &M) -> Self {
        Delivery {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
        }
    }
}
