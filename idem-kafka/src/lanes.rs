//! The member's partitions worked in parallel: one lane per partition it holds.
//!
//! The member's loop receives every message and routes it to the lane of its partition: a
//! queue in partition order. A lane with messages and nothing in flight hands its next
//! delivery (one message, or up to a batch of its partition's messages) to a
//! [worker](crate::worker), a task of its own that handles it, retries it and backs off
//! until every message of it is done. So each partition has at most one delivery in flight,
//! its messages are handled in order, and a partition that waits in back-off holds up no
//! other. The workers take a permit of the member's bound
//! ([`ConsumerBuilder::max_in_flight`](crate::ConsumerBuilder::max_in_flight)) for each
//! attempt, not for their back-off: at most that many deliveries use the database at
//! once.
//!
//! Everything about positions stays with the loop: a worker reports the messages it is
//! done with, in order, and the loop marks them processed in the member's progress, flushes
//! and commits. A report of a lane that was reset since its worker started (its partition
//! revoked, dropped or rewound to the stored position) is ignored: its messages are read
//! again.
//!
//! Memory stays bounded whatever a partition waits for, without pausing partitions while
//! the database keeps up. Once the lanes of the partitions that fetch hold the member's
//! bound of messages together, the loop holds back: it reads no more until they have
//! worked off half of it, and librdkafka keeps what it fetched meanwhile (within its own
//! bounds, `queued.max.messages.kbytes`). Only a hold that lasts
//! [`HOLD_BEFORE_PAUSE`] (a partition stuck in back-off, a database that stopped
//! answering) pauses the partitions with queued messages, each until its lane has worked
//! off half of its queue, and the loop reads again, for the group's events and the other
//! partitions. A pause is not free: librdkafka drops what it had fetched ahead for the
//! partition, and fetches it again after the last message the loop received once the
//! partition resumes.
//!
//! A lane is reset, its queue dropped and its worker told to stop (after the attempt in
//! flight, at once in a back-off), only when its queued messages are read again anyway:
//! its partition is revoked or rewound, or the member stops. Never otherwise: a lane that
//! went on past a message it dropped would commit past it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// How long the loop holds back before it pauses the partitions with queued messages.
pub(crate) const HOLD_BEFORE_PAUSE: Duration = Duration::from_secs(1);

use tokio::sync::watch;
use tokio::time::Instant;

use crate::delivery::Delivery;
use crate::handover::Key;

/// The lanes of the partitions a member holds.
#[derive(Debug)]
pub(crate) struct Lanes {
    lanes: HashMap<Key, Lane>,
    batch_size: usize,
    linger: Duration,
    /// Messages the lanes of the partitions that fetch queue together before the loop
    /// holds back.
    bound: usize,
    /// Since when the loop holds back.
    held_since: Option<Instant>,
    /// Distinguishes a lane's workers: a report of an older generation is stale.
    generations: u64,
}

#[derive(Debug)]
struct Lane {
    queue: VecDeque<Delivery>,
    /// When the oldest queued message arrived (the batch linger counts from it).
    since: Option<Instant>,
    generation: u64,
    /// The worker in flight: its generation, and its stop switch.
    running: Option<(u64, watch::Sender<bool>)>,
    paused: bool,
    /// A paused lane resumes at this many queued messages.
    resume_at: usize,
    /// The partition was revoked: nothing more is queued or started.
    revoking: bool,
}

/// A delivery for a worker: the partition, the lane's generation, the messages and the
/// switch that tells the worker to stop.
#[derive(Debug)]
pub(crate) struct Ready {
    pub key: Key,
    pub generation: u64,
    pub deliveries: Vec<Delivery>,
    pub stop: watch::Receiver<bool>,
}

/// What routing a message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routed {
    /// Queued.
    Queued,
    /// Dropped: the partition is being revoked.
    Dropped,
}

impl Lanes {
    /// Lanes handing out up to `batch_size` messages a delivery, waiting `linger` after a
    /// lane's first message for more (batches only), pausing a partition at `bound` queued
    /// messages.
    pub fn new(batch_size: usize, linger: Duration, bound: usize) -> Self {
        Lanes {
            lanes: HashMap::new(),
            batch_size: batch_size.max(1),
            linger,
            bound: bound.max(1),
            held_since: None,
            generations: 0,
        }
    }

    fn lane(&mut self, key: &Key) -> &mut Lane {
        if !self.lanes.contains_key(key) {
            self.generations += 1;
            self.lanes.insert(
                key.clone(),
                Lane {
                    queue: VecDeque::new(),
                    since: None,
                    generation: self.generations,
                    running: None,
                    paused: false,
                    resume_at: 0,
                    revoking: false,
                },
            );
        }
        self.lanes.get_mut(key).expect("inserted")
    }

    /// Queues `delivery` in its partition's lane.
    pub fn route(&mut self, delivery: Delivery, now: Instant) -> Routed {
        let key = (delivery.topic.clone(), delivery.partition);
        let lane = self.lane(&key);
        if lane.revoking {
            return Routed::Dropped;
        }
        lane.since.get_or_insert(now);
        lane.queue.push_back(delivery);
        Routed::Queued
    }

    /// Whether the loop reads the next message now: not while the lanes of the partitions
    /// that fetch (neither paused nor revoked) hold the bound together, until they have
    /// worked off half of it.
    pub fn reading(&mut self, now: Instant) -> bool {
        let queued: usize = self
            .lanes
            .values()
            .filter(|lane| !lane.paused && !lane.revoking)
            .map(|lane| lane.queue.len())
            .sum();
        match self.held_since {
            Some(_) if queued <= self.bound / 2 => self.held_since = None,
            None if queued >= self.bound => self.held_since = Some(now),
            _ => {}
        }
        self.held_since.is_none()
    }

    /// When the hold, if the loop holds back, turns into pausing
    /// ([`pause_held`](Self::pause_held)).
    pub fn hold_ends(&self) -> Option<Instant> {
        self.held_since.map(|since| since + HOLD_BEFORE_PAUSE)
    }

    /// The hold lasted: the partitions with queued messages, marked paused, each to
    /// resume once its lane has worked off half of its queue. The loop reads again.
    pub fn pause_held(&mut self) -> Vec<Key> {
        self.held_since = None;
        self.lanes
            .iter_mut()
            .filter(|(_, lane)| !lane.paused && !lane.revoking && !lane.queue.is_empty())
            .map(|(key, lane)| {
                lane.paused = true;
                lane.resume_at = lane.queue.len() / 2;
                key.clone()
            })
            .collect()
    }

    /// The deliveries to start now: of every lane with queued messages and nothing in
    /// flight, up to a batch (a batch waits for the linger, unless full). Marks them in
    /// flight.
    pub fn ready(&mut self, now: Instant) -> Vec<Ready> {
        let (batch_size, linger) = (self.batch_size, self.linger);
        let mut ready = Vec::new();
        for (key, lane) in &mut self.lanes {
            if lane.running.is_some() || lane.revoking || lane.queue.is_empty() {
                continue;
            }
            let lingered = lane.since.is_none_or(|since| since + linger <= now);
            if batch_size > 1 && lane.queue.len() < batch_size && !lingered {
                continue;
            }
            let take = lane.queue.len().min(batch_size);
            let deliveries: Vec<Delivery> = lane.queue.drain(..take).collect();
            lane.since = (!lane.queue.is_empty()).then_some(now);
            let (stop, stopped) = watch::channel(false);
            lane.running = Some((lane.generation, stop));
            ready.push(Ready {
                key: key.clone(),
                generation: lane.generation,
                deliveries,
                stop: stopped,
            });
        }
        ready
    }

    /// When the first lane waiting for its batch linger is due (batches only).
    pub fn next_due(&self) -> Option<Instant> {
        if self.batch_size <= 1 {
            return None;
        }
        self.lanes
            .values()
            .filter(|lane| lane.running.is_none() && !lane.revoking && !lane.queue.is_empty())
            .filter_map(|lane| lane.since.map(|since| since + self.linger))
            .min()
    }

    /// The paused partitions whose lanes worked off half their queue: marked resumed.
    pub fn take_resumable(&mut self) -> Vec<Key> {
        self.lanes
            .iter_mut()
            .filter(|(_, lane)| lane.paused && lane.queue.len() <= lane.resume_at)
            .map(|(key, lane)| {
                lane.paused = false;
                key.clone()
            })
            .collect()
    }

    /// Whether a report of `key`'s worker of `generation` still counts.
    pub fn is_current(&self, key: &Key, generation: u64) -> bool {
        self.lanes
            .get(key)
            .is_some_and(|lane| lane.generation == generation)
    }

    /// The worker of `key` of `generation` ended.
    pub fn finished(&mut self, key: &Key, generation: u64) {
        if let Some(lane) = self.lanes.get_mut(key)
            && lane
                .running
                .as_ref()
                .is_some_and(|(of, _)| *of == generation)
        {
            lane.running = None;
        }
    }

    /// Drops `key`'s queue and tells its worker to stop; the worker's later reports are
    /// stale. Returns whether the partition was paused (and marks it resumed).
    pub fn reset(&mut self, key: &Key) -> bool {
        self.generations += 1;
        let generation = self.generations;
        let Some(lane) = self.lanes.get_mut(key) else {
            return false;
        };
        lane.queue.clear();
        lane.since = None;
        lane.generation = generation;
        if let Some((_, stop)) = &lane.running {
            stop.send_replace(true);
        }
        std::mem::take(&mut lane.paused)
    }

    /// `keys` are being revoked: their queues are dropped, their workers told to stop
    /// (their reports still count, up to the revocation), and nothing more is queued or
    /// started.
    pub fn revoking(&mut self, keys: &[Key]) {
        for key in keys {
            let lane = self.lane(key);
            lane.revoking = true;
            lane.queue.clear();
            lane.since = None;
            if let Some((_, stop)) = &lane.running {
                stop.send_replace(true);
            }
        }
    }

    /// Forgets the lanes of `keys` (given up): a worker still running keeps its partition
    /// busy until it ends, its reports stale.
    pub fn remove(&mut self, keys: &[Key]) {
        for key in keys {
            if let Some(lane) = self.lanes.get(key)
                && lane.running.is_some()
            {
                self.reset(key);
                continue;
            }
            self.lanes.remove(key);
        }
    }

    /// `keys` were assigned: a lane left from an earlier assignment starts afresh (its
    /// worker, if one still runs, is stale).
    pub fn assigned(&mut self, keys: &[Key]) {
        for key in keys {
            if self.lanes.contains_key(key) {
                self.reset(key);
                self.lane(key).revoking = false;
            }
        }
    }

    /// Resets every lane (a dropped assignment).
    pub fn reset_all(&mut self) {
        let keys: Vec<Key> = self.lanes.keys().cloned().collect();
        self.remove(&keys);
    }

    /// The member stops: every queue is dropped and every worker told to stop.
    pub fn stop_all(&mut self) {
        for lane in self.lanes.values_mut() {
            lane.queue.clear();
            lane.since = None;
            lane.revoking = true;
            if let Some((_, stop)) = &lane.running {
                stop.send_replace(true);
            }
        }
    }

    /// Whether a worker of any of `keys` is running.
    pub fn any_running_of(&self, keys: &[Key]) -> bool {
        keys.iter().any(|key| {
            self.lanes
                .get(key)
                .is_some_and(|lane| lane.running.is_some())
        })
    }

    /// Whether any worker is running.
    pub fn any_running(&self) -> bool {
        self.lanes.values().any(|lane| lane.running.is_some())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{HOLD_BEFORE_PAUSE, Lanes, Routed};
    use crate::delivery::Delivery;

    fn message(partition: i32, offset: i64) -> Delivery {
        Delivery {
            topic: "t".into(),
            partition,
            offset,
            key: None,
            payload: None,
            headers: Vec::new(),
        }
    }

    #[test]
    fn one_delivery_in_flight_per_partition_in_order() {
        let now = Instant::now();
        let mut lanes = Lanes::new(1, Duration::ZERO, 10);
        for offset in 0..3 {
            lanes.route(message(0, offset), now);
            lanes.route(message(1, offset), now);
        }
        let mut ready = lanes.ready(now);
        ready.sort_by_key(|r| r.key.1);
        assert_eq!(ready.len(), 2, "one delivery per partition");
        assert_eq!(ready[0].deliveries[0].offset, 0);
        assert!(lanes.ready(now).is_empty(), "nothing more while in flight");
        lanes.finished(&ready[0].key, ready[0].generation);
        let next = lanes.ready(now);
        assert_eq!(next.len(), 1);
        assert_eq!((next[0].key.1, next[0].deliveries[0].offset), (0, 1));
    }

    #[test]
    fn full_lanes_hold_the_loop_back_until_they_worked_off_half() {
        let now = Instant::now();
        let mut lanes = Lanes::new(1, Duration::ZERO, 4);
        for offset in 0..2 {
            assert!(lanes.reading(now));
            lanes.route(message(0, offset), now);
            assert!(lanes.reading(now));
            lanes.route(message(1, offset), now);
        }
        assert!(!lanes.reading(now), "4 messages queued: held back");
        assert_eq!(lanes.hold_ends(), Some(now + HOLD_BEFORE_PAUSE));
        let ready = lanes.ready(now);
        for started in &ready {
            lanes.finished(&started.key, started.generation);
        }
        assert!(lanes.reading(now), "2 left: reading again");
        assert_eq!(lanes.hold_ends(), None);
        assert!(lanes.take_resumable().is_empty(), "nothing was paused");
    }

    #[test]
    fn a_hold_that_lasts_pauses_the_partitions_with_queued_messages() {
        let now = Instant::now();
        let mut lanes = Lanes::new(1, Duration::ZERO, 4);
        for offset in 0..5 {
            lanes.route(message(0, offset), now);
        }
        lanes.route(message(1, 0), now);
        let mut ready = lanes.ready(now);
        ready.sort_by_key(|r| r.key.1);
        lanes.finished(&ready[1].key, ready[1].generation);
        assert!(!lanes.reading(now));
        // Partition 0 is stuck (its worker never ends); partition 1 has nothing queued.
        assert_eq!(lanes.pause_held(), vec![("t".to_owned(), 0)]);
        assert!(
            lanes.reading(now),
            "a paused lane does not hold the loop back"
        );
        assert!(lanes.take_resumable().is_empty());
        lanes.finished(&ready[0].key, ready[0].generation);
        for _ in 0..2 {
            let again = lanes.ready(now).pop().unwrap();
            lanes.finished(&again.key, again.generation);
        }
        assert_eq!(
            lanes.take_resumable(),
            vec![("t".to_owned(), 0)],
            "at half its queue"
        );
    }

    #[test]
    fn a_reset_lane_makes_its_running_worker_stale_and_stops_it() {
        let now = Instant::now();
        let mut lanes = Lanes::new(1, Duration::ZERO, 10);
        lanes.route(message(0, 0), now);
        lanes.route(message(0, 1), now);
        let ready = lanes.ready(now).pop().unwrap();
        lanes.reset(&ready.key);
        assert!(*ready.stop.borrow());
        assert!(!lanes.is_current(&ready.key, ready.generation));
        lanes.route(message(0, 0), now);
        assert!(lanes.ready(now).is_empty(), "the old worker still runs");
        lanes.finished(&ready.key, ready.generation);
        assert_eq!(lanes.ready(now)[0].deliveries[0].offset, 0);
    }

    #[test]
    fn a_batch_waits_for_its_linger_unless_full() {
        let now = Instant::now();
        let mut lanes = Lanes::new(3, Duration::from_millis(20), 10);
        lanes.route(message(0, 0), now);
        assert!(lanes.ready(now).is_empty());
        assert_eq!(lanes.next_due(), Some(now + Duration::from_millis(20)));
        assert_eq!(lanes.ready(now + Duration::from_millis(20)).len(), 1);
        for offset in 1..4 {
            lanes.route(message(1, offset), now);
        }
        assert_eq!(lanes.ready(now)[0].deliveries.len(), 3);
    }

    #[test]
    fn a_revoking_lane_drops_what_arrives() {
        let now = Instant::now();
        let mut lanes = Lanes::new(1, Duration::ZERO, 10);
        lanes.route(message(0, 0), now);
        let ready = lanes.ready(now).pop().unwrap();
        lanes.revoking(std::slice::from_ref(&ready.key));
        assert!(*ready.stop.borrow());
        assert!(lanes.is_current(&ready.key, ready.generation));
        assert_eq!(lanes.route(message(0, 1), now), Routed::Dropped);
        assert!(lanes.any_running_of(std::slice::from_ref(&ready.key)));
        lanes.finished(&ready.key, ready.generation);
        assert!(!lanes.any_running());
    }
}
