//! A message taken off the consumer.

use rdkafka::message::Headers;

/// A message taken off the consumer, owned, so that it can outlive the consumer's buffer
/// (retries, a batch of several messages).
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Delivery {
    /// Copies a message received from rdkafka.
    pub fn from_message<M: rdkafka::Message>(message: &M) -> Self {
        let headers = message.headers().map_or_else(Vec::new, |headers| {
            headers
                .iter()
                .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
                .collect()
        });
        Delivery {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The value of the last header named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
    }
}
