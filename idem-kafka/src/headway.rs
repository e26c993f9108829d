//! The group's headway on every partition of its topic, as one member sees it: the
//! broker's watermarks beside the group's position (stored in PostgreSQL, or committed to
//! Kafka), whoever holds the partition.
//!
//! After Burrow's rules: a partition whose position does not move while it has lag is
//! stalled; a partition without lag is never stalled, however long it waits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// What one member sees of one partition of its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionHeadway {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The group's position: the next offset to process (the low watermark when the group
    /// has none; it may lie past the high watermark, when stored by hand).
    pub position: i64,
    /// The broker's high watermark: the offset after the last record.
    pub high_watermark: i64,
    /// Records behind the position: `high_watermark - position`.
    pub lag: i64,
    /// How long the position has not moved while the partition had lag (zero without lag).
    pub still_for: Duration,
    /// Whether it has been still for longer than the consumer's stall bound.
    pub stalled: bool,
    /// Whether this member holds it.
    pub held: bool,
}

/// The watermarks of one partition: the first offset the broker still has, and the offset
/// after its last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watermarks {
    pub low: i64,
    pub high: i64,
}

#[derive(Debug, Clone, Copy)]
struct Track {
    position: i64,
    /// When the position last moved, or the partition last had no lag.
    moving_at: Instant,
}

/// The partitions' tracks between two looks.
#[derive(Debug)]
pub(crate) struct Headway {
    topic: String,
    bound: Duration,
    tracks: BTreeMap<i32, Track>,
}

impl Headway {
    /// Tracks `topic`; a partition still for longer than `bound` is stalled.
    pub fn new(topic: String, bound: Duration) -> Self {
        Headway {
            topic,
            bound,
            tracks: BTreeMap::new(),
        }
    }

    /// A look at `now`: each partition's watermarks, the group's positions (partitions
    /// without one start at the low watermark), and the partitions this member holds.
    pub fn observe(
        &mut self,
        now: Instant,
        watermarks: &BTreeMap<i32, Watermarks>,
        positions: &HashMap<i32, i64>,
        held: &HashSet<i32>,
    ) -> Vec<PartitionHeadway> {
        self.tracks
            .retain(|partition, _| watermarks.contains_key(partition));
        watermarks
            .iter()
            .map(|(&partition, marks)| {
                let position = positions
                    .get(&partition)
                    .copied()
                    .unwrap_or(marks.low)
                    .max(marks.low);
                // (A position past the high watermark has no lag; the watch warns of it.)
                let lag = (marks.high - position).max(0);
                let track = self.tracks.entry(partition).or_insert(Track {
                    position,
                    moving_at: now,
                });
                if track.position != position || lag == 0 {
                    track.position = position;
                    track.moving_at = now;
                }
                let still_for = now.saturating_duration_since(track.moving_at);
                PartitionHeadway {
                    topic: self.topic.clone(),
                    partition,
                    position,
                    high_watermark: marks.high,
                    lag,
                    still_for,
                    stalled: still_for > self.bound,
                    held: held.contains(&partition),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::time::{Duration, Instant};

    use super::{Headway, Watermarks};

    fn marks(pairs: &[(i32, i64, i64)]) -> BTreeMap<i32, Watermarks> {
        pairs
            .iter()
            .map(|&(partition, low, high)| (partition, Watermarks { low, high }))
            .collect()
    }

    #[test]
    fn a_partition_with_lag_whose_position_does_not_move_stalls() {
        let start = Instant::now();
        let mut headway = Headway::new("t".into(), Duration::from_secs(30));
        let watermarks = marks(&[(0, 0, 100), (1, 0, 50), (2, 10, 10)]);
        let held = HashSet::from([0]);
        let positions = HashMap::from([(0, 40), (1, 20)]);
        let first = headway.observe(start, &watermarks, &positions, &held);
        assert!(first.iter().all(|p| !p.stalled));
        assert_eq!(
            first.iter().map(|p| p.lag).collect::<Vec<_>>(),
            vec![60, 30, 0]
        );
        // Partition 0 moves, 1 does not, 2 has no lag.
        let later = start + Duration::from_secs(31);
        let positions = HashMap::from([(0, 41), (1, 20)]);
        let second = headway.observe(later, &watermarks, &positions, &held);
        let stalled: Vec<i32> = second
            .iter()
            .filter(|p| p.stalled)
            .map(|p| p.partition)
            .collect();
        assert_eq!(stalled, vec![1]);
        assert_eq!(second[1].still_for, Duration::from_secs(31));
        assert!(second[0].held && !second[1].held);
        // Caught up: no longer stalled.
        let caught_up = HashMap::from([(0, 100), (1, 50)]);
        let third = headway.observe(
            later + Duration::from_secs(1),
            &watermarks,
            &caught_up,
            &held,
        );
        assert!(third.iter().all(|p| !p.stalled && p.lag == 0));
    }

    #[test]
    fn a_group_without_a_position_starts_at_the_low_watermark() {
        let mut headway = Headway::new("t".into(), Duration::from_secs(30));
        let seen = headway.observe(
            Instant::now(),
            &marks(&[(0, 5, 9)]),
            &HashMap::new(),
            &HashSet::new(),
        );
        assert_eq!((seen[0].position, seen[0].lag), (5, 4));
    }
}
