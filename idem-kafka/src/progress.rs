//! What a member knows of each partition it holds: how far it processed, what it
//! committed to Kafka, what it stored in PostgreSQL, and what it knows PostgreSQL holds.
//!
//! The last of these is what detects a database that went back (a failover to a standby
//! that had not received the last commits, a restore): the stored position of a partition
//! is never below what this member saw committed, unless the database lost commits. Every
//! write of a position is guarded by it ([`PositionRow::floor`]), and the consumer reads
//! the stored positions back to compare ([`Progress::behind`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rdkafka::{Offset, TopicPartitionList};

use crate::stats::lock;

/// A position to store: topic, partition, the offset to read next, and the floor: the
/// stored position this member knows PostgreSQL held already (`-1`: none known). A stored
/// position below the floor means the database lost commits, and the write is refused
/// ([`PositionBehind`](crate::PositionBehind)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PositionRow {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
    pub floor: i64,
}

/// Positions not stored yet.
pub(crate) type Pending = Vec<PositionRow>;

/// One partition: processed up to `next`, committed to Kafka up to `committed`, stored in
/// PostgreSQL up to `stored` (`-1`: nothing yet), and known to be committed in PostgreSQL
/// up to `confirmed` (read from it, or written by a transaction that committed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PartitionProgress {
    pub next: i64,
    pub committed: i64,
    pub stored: i64,
    pub confirmed: i64,
}

impl PartitionProgress {
    const NEW: PartitionProgress = PartitionProgress {
        next: -1,
        committed: -1,
        stored: -1,
        confirmed: -1,
    };
}

/// The progress of every partition a member holds.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    partitions: Mutex<HashMap<(String, i32), PartitionProgress>>,
    /// The partitions assigned to the member now.
    held: Mutex<BTreeSet<(String, i32)>>,
}

impl Progress {
    /// A message is done with; `stored`: its position is stored in PostgreSQL already, by
    /// a transaction that committed.
    pub fn processed(&self, topic: &str, partition: i32, offset: i64, stored: bool) {
        let mut partitions = lock(&self.partitions);
        let entry = partitions
            .entry((topic.to_owned(), partition))
            .or_insert(PartitionProgress::NEW);
        entry.next = entry.next.max(offset + 1);
        if stored {
            entry.stored = entry.stored.max(offset + 1);
            entry.confirmed = entry.confirmed.max(offset + 1);
        }
    }

    /// The floor of a position written in `topic`/`partition` now (`-1`: none known).
    pub fn floor(&self, topic: &str, partition: i32) -> i64 {
        lock(&self.partitions)
            .get(&(topic.to_owned(), partition))
            .map_or(-1, |entry| entry.confirmed)
    }

    /// A partition was assigned, starting at `stored` as read from PostgreSQL (`None`:
    /// no stored position, or not read): whatever was known of it before is forgotten.
    pub fn assigned(&self, topic: &str, partition: i32, stored: Option<i64>) {
        let confirmed = stored.unwrap_or(-1);
        lock(&self.partitions).insert(
            (topic.to_owned(), partition),
            PartitionProgress {
                confirmed,
                ..PartitionProgress::NEW
            },
        );
    }

    /// Forgets the partitions of `keys` (revoked), returning what was known of them.
    pub fn remove(&self, keys: &[(String, i32)]) -> Vec<((String, i32), PartitionProgress)> {
        let mut partitions = lock(&self.partitions);
        keys.iter()
            .filter_map(|key| partitions.remove(key).map(|entry| (key.clone(), entry)))
            .collect()
    }

    /// Forgets everything (a failed rebalance).
    pub fn clear(&self) {
        lock(&self.partitions).clear();
        lock(&self.held).clear();
    }

    /// `partitions` were assigned to the member.
    pub fn hold(&self, partitions: &[(String, i32)]) {
        lock(&self.held).extend(partitions.iter().cloned());
    }

    /// `partitions` were taken from the member.
    pub fn release(&self, partitions: &[(String, i32)]) {
        let mut held = lock(&self.held);
        for partition in partitions {
            held.remove(partition);
        }
    }

    /// The partitions of `topic` the member holds.
    pub fn held(&self, topic: &str) -> HashSet<i32> {
        lock(&self.held)
            .iter()
            .filter(|(t, _)| t == topic)
            .map(|(_, partition)| *partition)
            .collect()
    }

    /// How far the member processed each partition of `topic` it knows of.
    pub fn processed_up_to(&self, topic: &str) -> HashMap<i32, i64> {
        lock(&self.partitions)
            .iter()
            .filter(|((t, _), entry)| t == topic && entry.next >= 0)
            .map(|((_, partition), entry)| (*partition, entry.next))
            .collect()
    }

    /// The processed positions not committed to Kafka yet; marks them committed.
    pub fn uncommitted(&self) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for ((topic, partition), entry) in lock(&self.partitions).iter_mut() {
            if entry.next > entry.committed {
                // A partition that is not in the list is not committed: ignore the error.
                list.add_partition_offset(topic, *partition, Offset::Offset(entry.next))
                    .ok();
                entry.committed = entry.next;
            }
        }
        list
    }

    /// Marks the positions of `list` as not committed, to retry them.
    pub fn uncommit(&self, list: &TopicPartitionList) {
        let mut partitions = lock(&self.partitions);
        for element in list.elements() {
            if let Some(entry) =
                partitions.get_mut(&(element.topic().to_owned(), element.partition()))
            {
                entry.committed = -1;
            }
        }
    }

    /// The processed positions not stored in PostgreSQL yet, with their floors; marks
    /// them stored.
    pub fn unstored(&self) -> Pending {
        let mut pending = Vec::new();
        for ((topic, partition), entry) in lock(&self.partitions).iter_mut() {
            if entry.next > entry.stored {
                pending.push(PositionRow {
                    topic: topic.clone(),
                    partition: *partition,
                    next_offset: entry.next,
                    floor: entry.confirmed,
                });
                entry.stored = entry.next;
            }
        }
        pending
    }

    /// `pending` was stored by a transaction that committed.
    pub fn confirm(&self, pending: &Pending) {
        let mut partitions = lock(&self.partitions);
        for row in pending {
            if let Some(entry) = partitions.get_mut(&(row.topic.clone(), row.partition)) {
                entry.confirmed = entry.confirmed.max(row.next_offset);
            }
        }
    }

    /// Marks `pending` as not stored, to retry them.
    pub fn unstore(&self, pending: &Pending) {
        let mut partitions = lock(&self.partitions);
        for row in pending {
            if let Some(entry) = partitions.get_mut(&(row.topic.clone(), row.partition)) {
                entry.stored = -1;
            }
        }
    }

    /// Whether a stored position is known of any partition (else there is nothing to
    /// compare the stored positions with).
    pub fn knows_stored(&self) -> bool {
        lock(&self.partitions)
            .values()
            .any(|entry| entry.confirmed > 0)
    }

    /// The partitions of `topic` whose position stored in PostgreSQL (`stored`, by
    /// partition) is below what this member knows was committed there: the database went
    /// back. Each with its stored position (`None`: the row is gone) and the position this
    /// member knew.
    pub fn behind(&self, topic: &str, stored: &HashMap<i32, i64>) -> Vec<Behind> {
        let mut behind: Vec<Behind> = lock(&self.partitions)
            .iter()
            .filter(|((t, _), entry)| t == topic && entry.confirmed > 0)
            .filter_map(|((_, partition), entry)| {
                let now = stored.get(partition).copied();
                (now.unwrap_or(-1) < entry.confirmed).then_some(Behind {
                    partition: *partition,
                    stored: now,
                    known: entry.confirmed,
                })
            })
            .collect();
        behind.sort_by_key(|behind| behind.partition);
        behind
    }

    /// Starts `topic`/`partition` over from `stored` (what PostgreSQL holds now): nothing
    /// processed, committed or stored since counts any more.
    pub fn rewind(&self, topic: &str, partition: i32, stored: Option<i64>) {
        self.assigned(topic, partition, stored);
    }
}

/// The positions that batch handlers' transactions stored ([`BatchPositions`](crate::BatchPositions)),
/// for the consumer to learn what PostgreSQL holds once the round is over. A transaction
/// that rolls back after storing takes its rows back ([`Receipts::take_back`]); one whose
/// commit failed leaves rows that are too high, which only makes the member read its
/// partitions again from what is stored (duplicates, nothing lost).
#[derive(Debug, Default)]
pub(crate) struct Receipts {
    rows: Mutex<Vec<(u64, PositionRow)>>,
    next_token: std::sync::atomic::AtomicU64,
}

impl Receipts {
    /// A token for the rows of one writer.
    pub fn token(&self) -> u64 {
        self.next_token
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// `rows` were stored by the writer of `token`.
    pub fn record(&self, token: u64, rows: &[PositionRow]) {
        lock(&self.rows).extend(rows.iter().map(|row| (token, row.clone())));
    }

    /// The transaction of `token`'s writer rolls back.
    pub fn take_back(&self, token: u64) {
        lock(&self.rows).retain(|(of, _)| *of != token);
    }

    /// The rows recorded since the last drain.
    pub fn drain(&self) -> Vec<PositionRow> {
        lock(&self.rows).drain(..).map(|(_, row)| row).collect()
    }
}

/// A handle on the consumer's [`Receipts`], held by the positions it hands out. Not part
/// of what makes two positions equal.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReceiptsHandle(pub Option<Arc<Receipts>>);

impl PartialEq for ReceiptsHandle {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ReceiptsHandle {}

/// A partition whose stored position went back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behind {
    pub partition: i32,
    /// The position PostgreSQL holds now (`None`: no row).
    pub stored: Option<i64>,
    /// The position this member knew was committed.
    pub known: i64,
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{Behind, Progress};

    #[test]
    fn a_stored_position_below_what_was_committed_is_behind() {
        let progress = Progress::default();
        progress.assigned("t", 0, Some(10));
        progress.assigned("t", 1, None);
        progress.assigned("t", 2, Some(7));
        progress.processed("t", 0, 19, true);
        progress.processed("t", 1, 4, false);
        let stored = HashMap::from([(0, 15), (2, 7)]);
        assert_eq!(
            progress.behind("t", &stored),
            vec![Behind {
                partition: 0,
                stored: Some(15),
                known: 20
            }]
        );
        // A row that is gone, where one was known.
        assert_eq!(
            progress.behind("t", &HashMap::from([(0, 20)])),
            vec![Behind {
                partition: 2,
                stored: None,
                known: 7
            }]
        );
        assert!(progress.behind("other", &stored).is_empty());
    }

    #[test]
    fn a_flushed_position_is_confirmed_once_committed_and_floors_the_next() {
        let progress = Progress::default();
        progress.assigned("t", 0, Some(3));
        progress.processed("t", 0, 8, false);
        let pending = progress.unstored();
        assert_eq!(pending.len(), 1);
        assert_eq!((pending[0].next_offset, pending[0].floor), (9, 3));
        assert_eq!(progress.floor("t", 0), 3);
        progress.confirm(&pending);
        assert_eq!(progress.floor("t", 0), 9);
        progress.rewind("t", 0, Some(5));
        assert_eq!(progress.floor("t", 0), 5);
        assert!(progress.unstored().is_empty(), "nothing processed since");
    }
}
