//! Counters of one or several consumers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::fate::Fate;
use crate::headway::PartitionHeadway;

/// Counters of one or several consumers (share one `Arc<Stats>` between them with
/// [`ConsumerBuilder::stats`](crate::ConsumerBuilder::stats)).
#[derive(Debug, Default)]
pub struct Stats {
    deliveries: AtomicU64,
    executed: AtomicU64,
    duplicates: AtomicU64,
    skipped: AtomicU64,
    dead_letters: AtomicU64,
    retries: AtomicU64,
    in_progress: AtomicU64,
    batches: AtomicU64,
    rewinds: AtomicU64,
    positions: Mutex<HashMap<(String, i32), i64>>,
    headway: Mutex<Vec<PartitionHeadway>>,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Messages received from Kafka, redeliveries and duplicates included.
    pub deliveries: u64,
    /// Deliveries whose handler ran and completed its effects.
    pub executed: u64,
    /// Deliveries of keys that had already been handled: skipped.
    pub duplicates: u64,
    /// Deliveries the handler had nothing to do for.
    pub skipped: u64,
    /// Deliveries written to the dead-letter table.
    pub dead_letters: u64,
    /// Retries of a message (or of the rest of a batch) after a failure that can pass.
    pub retries: u64,
    /// Those of the retries whose key was held by another delivery (`InProgress`).
    pub in_progress: u64,
    /// Rounds of the handler that took several messages together.
    pub batches: u64,
    /// Times a partition went back to the position stored in PostgreSQL because the
    /// database had lost commits ([`PositionBehind`](crate::PositionBehind)).
    pub rewinds: u64,
}

impl Snapshot {
    /// The counters of `self` and `other` added up.
    pub fn plus(self, other: Snapshot) -> Snapshot {
        Snapshot {
            deliveries: self.deliveries + other.deliveries,
            executed: self.executed + other.executed,
            duplicates: self.duplicates + other.duplicates,
            skipped: self.skipped + other.skipped,
            dead_letters: self.dead_letters + other.dead_letters,
            retries: self.retries + other.retries,
            in_progress: self.in_progress + other.in_progress,
            batches: self.batches + other.batches,
            rewinds: self.rewinds + other.rewinds,
        }
    }
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            deliveries: self.deliveries.load(Ordering::Relaxed),
            executed: self.executed.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            dead_letters: self.dead_letters.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            in_progress: self.in_progress.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            rewinds: self.rewinds.load(Ordering::Relaxed),
        }
    }

    /// Whether every partition of `topic` in `end_offsets` (partition -> offset after the
    /// last message) has been processed to its end by the consumers counted here.
    pub fn caught_up(&self, topic: &str, end_offsets: &HashMap<i32, i64>) -> bool {
        caught_up([self], topic, end_offsets)
    }

    /// Per topic and partition, the offset after the last message processed.
    pub fn positions(&self) -> HashMap<(String, i32), i64> {
        lock(&self.positions).clone()
    }

    /// The last look at every partition of the topic, by the stall watch of a consumer
    /// counted here (every few seconds): lag, how long each has stood still, which this
    /// member holds. Empty before the first look.
    pub fn headway(&self) -> Vec<PartitionHeadway> {
        lock(&self.headway).clone()
    }

    pub(crate) fn looked(&self, seen: Vec<PartitionHeadway>) {
        *lock(&self.headway) = seen;
    }

    pub(crate) fn received(&self, count: usize) {
        self.deliveries.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn batch(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// A message done with: its final fate. Also counted in the metrics
    /// `idem_kafka_messages_total{topic, fate}` and, for a dead letter,
    /// `idem_kafka_dead_letters_total{topic, reason}`.
    pub(crate) fn processed(&self, topic: &str, partition: i32, offset: i64, fate: &Fate) {
        if fate.is_final() {
            metrics::counter!(
                "idem_kafka_messages_total",
                "topic" => topic.to_owned(), "fate" => fate.as_str()
            )
            .increment(1);
        }
        if let Fate::DeadLetter { reason, .. } = fate {
            metrics::counter!(
                "idem_kafka_dead_letters_total",
                "topic" => topic.to_owned(), "reason" => reason.as_str()
            )
            .increment(1);
        }
        let counter = match fate {
            Fate::Executed => &self.executed,
            Fate::Duplicate => &self.duplicates,
            Fate::Skipped => &self.skipped,
            Fate::DeadLetter { .. } => &self.dead_letters,
            Fate::Retry { .. } => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut positions = lock(&self.positions);
        let next = positions.entry((topic.to_owned(), partition)).or_insert(0);
        *next = (*next).max(offset + 1);
    }

    /// `topic`/`partition` went back to `next` (the database lost commits).
    pub(crate) fn rewound(&self, topic: &str, partition: i32, next: i64) {
        self.rewinds.fetch_add(1, Ordering::Relaxed);
        lock(&self.positions).insert((topic.to_owned(), partition), next.max(0));
    }

    /// A retry; also counted in the metric `idem_kafka_retries_total{kind}`: `in_progress`
    /// (another delivery held the key) or `failure`.
    pub(crate) fn retried(&self, in_progress: bool) {
        let kind = if in_progress {
            "in_progress"
        } else {
            "failure"
        };
        metrics::counter!("idem_kafka_retries_total", "kind" => kind).increment(1);
        self.retries.fetch_add(1, Ordering::Relaxed);
        if in_progress {
            self.in_progress.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether the consumers counted by `stats` together processed every partition of `topic`
/// in `end_offsets` (partition -> offset after the last message) to its end.
pub fn caught_up<'a>(
    stats: impl IntoIterator<Item = &'a Stats>,
    topic: &str,
    end_offsets: &HashMap<i32, i64>,
) -> bool {
    let mut reached: HashMap<i32, i64> = HashMap::new();
    for stats in stats {
        for ((t, partition), next) in lock(&stats.positions).iter() {
            if t == topic {
                let entry = reached.entry(*partition).or_insert(0);
                *entry = (*entry).max(*next);
            }
        }
    }
    end_offsets.iter().all(|(partition, &end)| {
        end <= 0 || reached.get(partition).is_some_and(|&next| next >= end)
    })
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
