//! Order events as a producer publishes them: each stamped with its idempotency key, some
//! sent more than once (a retrying producer), and optionally some malformed ones.
//!
//! The key is derived on the producer side with [`KeyBuilder`] from the fields that make
//! the business fact, `order_id` and `event_type` ([`event_key`]): every send of the same
//! fact carries the same key, whoever sends it and however often. A consumer keying on
//! `order_id, event_type` derives the very same UUID (its generated `<handler>_key`
//! returns it; a test here checks that). The demo's handlers key on the stamp itself, and
//! their `<handler>_key` functions give callers the key they record.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use idem_runtime::IdempotencyKey;
use idem_runtime::key::KeyBuilder;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::orders::{EventType, OrderEvent};
use idem_kafka::Reason;

/// The idempotency key of an order event: `order_id` and `event_type`, in that order.
pub fn event_key(order_id: &str, event_type: EventType) -> IdempotencyKey {
    KeyBuilder::new()
        .part("order_id", order_id)
        .and_then(|builder| builder.part("event_type", &event_type))
        .expect("strings and unit enums always encode")
        .finish()
}

/// What to publish.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Distinct business facts (order events): three per order (placed, paid, shipped).
    pub events: usize,
    /// Extra sends of already-sent facts, as a fraction of `events` (0.25: 25 duplicate
    /// sends per 100 events). A duplicate is the same record sent again a little later.
    pub duplicate_rate: f64,
    /// Malformed messages to inject, spread over the four kinds of [`MalformedKind`].
    pub malformed: usize,
    /// The seed of the pseudo-random choices (amounts, which facts are sent twice, where).
    pub seed: u64,
    /// The prefix of the order ids, to keep the facts of several runs apart.
    pub order_prefix: String,
    /// Send duplicates with another Kafka key than their original (as a second upstream
    /// system, or a replay tool, would), so that they land on other partitions and two
    /// consumers may hold the same fact at once. Default: the same key, the same partition.
    pub scatter_duplicates: bool,
}

impl PlanConfig {
    /// `events` facts with `duplicate_rate` and no malformed message.
    pub fn new(events: usize, duplicate_rate: f64) -> Self {
        PlanConfig {
            events,
            duplicate_rate,
            malformed: 0,
            seed: 7,
            order_prefix: "order".to_owned(),
            scatter_duplicates: false,
        }
    }
}

/// The kinds of malformed messages, each ending in the dead-letter table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MalformedKind {
    /// Not an order event: broken JSON, an unknown event type, bytes that are not UTF-8.
    Undecodable,
    /// An order event without its `event_key`.
    MissingKey,
    /// The key of an event already sent, with another amount.
    PayloadMismatch,
    /// An event the handler refuses every time (a negative amount): parked after
    /// `max_attempts`.
    Parked,
}

impl MalformedKind {
    const ALL: [MalformedKind; 4] = [
        MalformedKind::Undecodable,
        MalformedKind::MissingKey,
        MalformedKind::Parked,
        MalformedKind::PayloadMismatch,
    ];

    /// The dead-letter reason the consumer gives it.
    pub fn reason(self) -> Reason {
        match self {
            MalformedKind::Undecodable => Reason::Undecodable,
            MalformedKind::MissingKey => Reason::MissingKey,
            MalformedKind::PayloadMismatch => Reason::PayloadMismatch,
            MalformedKind::Parked => Reason::Parked,
        }
    }
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// The first send of a business fact.
    Event,
    /// A repeated send of a fact.
    Duplicate,
    /// A malformed message.
    Malformed(MalformedKind),
}

/// One record to send.
#[derive(Debug, Clone)]
pub struct PlannedRecord {
    /// The Kafka key: the order id, so that the events of an order stay in order in one
    /// partition.
    pub key: Vec<u8>,
    /// The payload.
    pub payload: Vec<u8>,
    /// What it is.
    pub kind: RecordKind,
}

/// Everything to publish, in order.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The business facts: each must end up applied exactly once.
    pub events: Vec<OrderEvent>,
    /// The records, in sending order.
    pub records: Vec<PlannedRecord>,
    /// Records sent only once every record above is acknowledged: the payload
    /// mismatches, which must reach their partition after the event they contradict.
    pub tail: Vec<PlannedRecord>,
}

impl Plan {
    /// Plans the records for `config`, deterministically from its seed but for the facts'
    /// times, which are the time of planning (a plan made again is new facts to a handler
    /// keyed on the time).
    pub fn new(config: &PlanConfig) -> Self {
        let mut rng = SplitMix64(config.seed);
        let n = config.events;
        // Each fact is stamped once, as the plan is made: a recent time, to the microsecond
        // (what JSON carries and PostgreSQL keeps), one microsecond apart; a re-send is a
        // copy of its fact's record and carries the same stamp. The consumers keep their
        // keys by it (`event_time`), inside the retention window.
        let now = Utc::now();
        let base = DateTime::<Utc>::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
        let types = [EventType::Placed, EventType::Paid, EventType::Shipped];
        let events: Vec<OrderEvent> = (0..n)
            .map(|i| {
                let order_id = format!("{}-{:06}", config.order_prefix, i / 3);
                let event_type = types[i % 3];
                OrderEvent {
                    event_key: Some(event_key(&order_id, event_type).as_uuid()),
                    order_id,
                    event_type,
                    amount_cents: 100 + rng.below(99_900) as i64,
                    occurred_at: base + chrono::Duration::microseconds(i as i64),
                }
            })
            .collect();

        // (position, rank, sequence) orders the records: an event at its index, a
        // duplicate a little after its original, malformed records anywhere.
        let mut placed: Vec<((usize, u8, usize), PlannedRecord)> = events
            .iter()
            .enumerate()
            .map(|(i, event)| ((i, 0, 0), record(event, RecordKind::Event)))
            .collect();
        let duplicates = if n == 0 {
            0
        } else {
            (n as f64 * config.duplicate_rate).round() as usize
        };
        for sequence in 0..duplicates {
            let original = rng.below(n as u64) as usize;
            let at = (original + 1 + rng.below(200) as usize).min(n - 1);
            let mut duplicate = record(&events[original], RecordKind::Duplicate);
            if config.scatter_duplicates {
                duplicate
                    .key
                    .extend_from_slice(format!("/resend-{sequence}").as_bytes());
            }
            placed.push(((at, 1, sequence), duplicate));
        }
        let mut tail = Vec::new();
        for m in 0..config.malformed {
            let kind = MalformedKind::ALL[m % MalformedKind::ALL.len()];
            let prefix = &config.order_prefix;
            let planned = match kind {
                MalformedKind::Undecodable => {
                    let payload = match m % 3 {
                        0 => format!("{{\"order_id\": \"{prefix}-junk-{m}\", \"event_type\": ").into_bytes(),
                        1 => format!(
                            "{{\"order_id\":\"{prefix}-junk-{m}\",\"event_type\":\"refunded\",\"amount_cents\":1,\"occurred_at\":\"2024-05-01T12:00:00Z\",\"event_key\":null}}"
                        )
                        .into_bytes(),
                        _ => vec![0xff, 0xfe, 0x00, b'j', b'u', b'n', b'k', m as u8],
                    };
                    PlannedRecord {
                        key: format!("{prefix}-junk-{m}").into_bytes(),
                        payload,
                        kind: RecordKind::Malformed(kind),
                    }
                }
                MalformedKind::MissingKey => {
                    let event = OrderEvent {
                        order_id: format!("{prefix}-nokey-{m}"),
                        event_type: EventType::Placed,
                        amount_cents: 100,
                        occurred_at: base,
                        event_key: None,
                    };
                    record(&event, RecordKind::Malformed(kind))
                }
                MalformedKind::Parked => {
                    let order_id = format!("{prefix}-refused-{m}");
                    let event = OrderEvent {
                        event_key: Some(event_key(&order_id, EventType::Paid).as_uuid()),
                        order_id,
                        event_type: EventType::Paid,
                        amount_cents: -500,
                        occurred_at: base,
                    };
                    record(&event, RecordKind::Malformed(kind))
                }
                MalformedKind::PayloadMismatch => {
                    if n == 0 {
                        continue;
                    }
                    let mut event = events[rng.below(n as u64) as usize].clone();
                    event.amount_cents += 1;
                    tail.push(record(&event, RecordKind::Malformed(kind)));
                    continue;
                }
            };
            let at = rng.below(n.max(1) as u64) as usize;
            placed.push(((at, 2, m), planned));
        }
        placed.sort_by_key(|(position, _)| *position);
        Plan {
            events,
            records: placed.into_iter().map(|(_, record)| record).collect(),
            tail,
        }
    }

    /// Every record, in sending order.
    pub fn all(&self) -> impl Iterator<Item = &PlannedRecord> {
        self.records.iter().chain(&self.tail)
    }

    /// The number of records of `kind`.
    pub fn count(&self, kind: impl Fn(RecordKind) -> bool) -> usize {
        self.all().filter(|record| kind(record.kind)).count()
    }
}

fn record(event: &OrderEvent, kind: RecordKind) -> PlannedRecord {
    PlannedRecord {
        key: event.order_id.clone().into_bytes(),
        payload: serde_json::to_vec(event).expect("an order event serialises"),
        kind,
    }
}

/// A malformed record as the broker stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMalformed {
    /// Its kind.
    pub kind: MalformedKind,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// What was published.
#[derive(Debug, Clone, Default)]
pub struct ProduceReport {
    /// Records acknowledged by the broker.
    pub records: usize,
    /// First sends of facts.
    pub events: usize,
    /// Repeated sends of facts.
    pub duplicates: usize,
    /// The malformed records and where they landed.
    pub malformed: Vec<SentMalformed>,
    /// Per partition, the offset after the last record sent.
    pub end_offsets: HashMap<i32, i64>,
    /// How long publishing took.
    pub elapsed: Duration,
}

/// A producer for [`produce`]: acknowledged by the broker, small batches.
pub fn create_producer(brokers: &str) -> Result<FutureProducer, KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
}

/// Sends the plan to `topic`, `chunk` records at a time (each chunk acknowledged before
/// the next), calling `progress(sent, total)` after each chunk.
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    plan: &Plan,
    chunk: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<ProduceReport, KafkaError> {
    let started = Instant::now();
    let total = plan.records.len() + plan.tail.len();
    let mut report = ProduceReport::default();
    for part in [&plan.records, &plan.tail] {
        for records in part.chunks(chunk.max(1)) {
            let mut pending = Vec::with_capacity(records.len());
            for planned in records {
                let mut record = FutureRecord::to(topic)
                    .key(&planned.key)
                    .payload(&planned.payload);
                let delivery = loop {
                    match producer.send_result(record) {
                        Ok(delivery) => break delivery,
                        Err((
                            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                            returned,
                        )) => {
                            record = returned;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err((error, _)) => return Err(error),
                    }
                };
                pending.push((planned, delivery));
            }
            for (planned, delivery) in pending {
                let delivered = delivery
                    .await
                    .map_err(|_| KafkaError::Canceled)?
                    .map_err(|(error, _)| error)?;
                report.records += 1;
                let end = report.end_offsets.entry(delivered.partition).or_insert(0);
                *end = (*end).max(delivered.offset + 1);
                match planned.kind {
                    RecordKind::Event => report.events += 1,
                    RecordKind::Duplicate => report.duplicates += 1,
                    RecordKind::Malformed(kind) => report.malformed.push(SentMalformed {
                        kind,
                        partition: delivered.partition,
                        offset: delivered.offset,
                        payload: planned.payload.clone(),
                    }),
                }
            }
            progress(report.records, total);
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A small deterministic generator (SplitMix64): the plan depends on the seed only.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound > 0`).
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consumer that keys on the fact's fields rather than on the producer's stamp.
    #[idem_runtime::idempotent(key = "order_id, event_type", scope = "by_fact")]
    async fn apply_by_fact(
        tx: &mut sqlx::PgConnection,
        event: &OrderEvent,
    ) -> Result<(), sqlx::Error> {
        let _ = (tx, event);
        Ok(())
    }

    #[test]
    fn the_stamp_is_the_key_a_consumer_derives_from_the_fact_fields() {
        let event = OrderEvent {
            order_id: "order-1".to_owned(),
            event_type: EventType::Paid,
            amount_cents: 100,
            occurred_at: Utc::now(),
            event_key: None,
        };
        let derived = apply_by_fact_key(&event).unwrap();
        assert_eq!(event_key("order-1", EventType::Paid), derived.key());
    }

    #[test]
    fn a_plan_has_the_requested_duplicates_and_malformed_records() {
        let mut config = PlanConfig::new(300, 0.25);
        config.malformed = 8;
        let plan = Plan::new(&config);
        assert_eq!(plan.count(|kind| kind == RecordKind::Event), 300);
        assert_eq!(plan.count(|kind| kind == RecordKind::Duplicate), 75);
        assert_eq!(
            plan.count(|kind| matches!(kind, RecordKind::Malformed(_))),
            8
        );
        assert_eq!(plan.tail.len(), 2);
        // A duplicate never precedes its original.
        let mut seen = std::collections::HashSet::new();
        for record in &plan.records {
            match record.kind {
                RecordKind::Event => assert!(seen.insert(record.payload.clone())),
                RecordKind::Duplicate => assert!(seen.contains(&record.payload)),
                RecordKind::Malformed(_) => {}
            }
        }
    }
}
