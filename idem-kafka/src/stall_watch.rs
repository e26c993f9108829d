//! The member's watch over its group's headway: every few seconds it looks at every
//! partition of the topic ([`GroupView`] and the stored positions), reports what it sees
//! (gauges per partition, a warning for each partition that stalled, the stats' snapshot),
//! and tells the consumer's loop when the member itself is stuck: to rejoin the group,
//! and if that does not help, to stop with an error that says why, so that its supervisor
//! starts it again. A member never waits for ever without saying so.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::Idem;
use sqlx::Connection as _;
use tokio::sync::watch;

use crate::group_view::GroupView;
use crate::headway::{Headway, PartitionHeadway};
use crate::offset_store::OffsetStore;
use crate::progress::Progress;
use crate::schema::Schema;
use crate::stats::{Stats, lock};
use crate::store;

/// What the member's loop is doing, as the watch needs to know it.
#[derive(Debug)]
pub(crate) struct Activity {
    working: AtomicBool,
    received_at: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            working: AtomicBool::new(false),
            received_at: Mutex::new(Instant::now()),
        }
    }
}

impl Activity {
    /// A message was taken off the consumer.
    pub fn received(&self) {
        *lock(&self.received_at) = Instant::now();
    }

    /// The loop handles messages, or waits to retry one (`true`), or waits for messages
    /// (`false`): a partition that does not move while the loop works is the message's
    /// (a slow body, a database that does not answer), not the group's.
    pub fn working(&self, working: bool) {
        self.working.store(working, Ordering::Relaxed);
    }

    fn quiet_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*lock(&self.received_at))
    }
}

/// What the watch tells the member's loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing to do.
    Steady,
    /// Leave the group and join it again (the `n`th time in this stall), for `why`.
    Rejoin { n: u32, why: String },
    /// Stop with an error: rejoining did not help.
    GiveUp { why: String },
}

/// The settings of the watch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// How often it looks.
    pub every: Duration,
    /// How long a partition with lag may stand still before it counts as stalled.
    pub stall: Duration,
    /// How long after the first rejoin of a stall the member gives up.
    pub give_up: Duration,
}

/// Everything the watch reads.
pub(crate) struct StallWatch {
    pub view: GroupView,
    pub idem: Idem,
    pub schema: Schema,
    pub group: String,
    pub topic: String,
    pub client_id: String,
    pub offsets: OffsetStore,
    pub progress: Arc<Progress>,
    pub activity: Arc<Activity>,
    pub stats: Arc<Stats>,
    pub bounds: Bounds,
}

/// Where the member stands in a stall.
#[derive(Debug, Default)]
struct Episode {
    /// When the member was first found stuck in this stall.
    since: Option<Instant>,
    rejoins: u32,
    first_rejoin: Option<Instant>,
    last_rejoin: Option<Instant>,
    /// When each stalled partition was last warned about.
    warned: HashMap<i32, Instant>,
}

impl StallWatch {
    /// Watches until `verdicts` has no receiver.
    pub async fn run(self, verdicts: watch::Sender<Verdict>) {
        let mut headway = Headway::new(self.topic.clone(), self.bounds.stall);
        let mut episode = Episode::default();
        let mut tick = tokio::time::interval(self.bounds.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if verdicts.is_closed() {
                return;
            }
            let Some(seen) = self.look(&mut headway).await else {
                continue;
            };
            let verdict = self.judge(&seen, &mut episode, Instant::now()).await;
            if verdict != Verdict::Steady {
                verdicts.send_replace(verdict);
            }
        }
    }

    /// One look at every partition; `None` when the broker or the database cannot say
    /// (an outage is not a stall of the group: the member's own retries report it).
    async fn look(&self, headway: &mut Headway) -> Option<Vec<PartitionHeadway>> {
        let (watermarks, committed) = match self.view.look(self.offsets).await {
            Ok(looked) => looked,
            Err(error) => {
                tracing::debug!(%error, topic = %self.topic, "cannot read the topic's watermarks; looking again later");
                return None;
            }
        };
        let mut positions = match committed {
            Some(committed) => committed,
            None => match self.stored_positions().await {
                Ok(stored) => stored,
                Err(error) => {
                    tracing::debug!(%error, "cannot read the stored positions; looking again later");
                    return None;
                }
            },
        };
        // The member is ahead of what it stored or committed by up to a commit interval.
        for (partition, next) in self.progress.processed_up_to(&self.topic) {
            let position = positions.entry(partition).or_insert(next);
            *position = (*position).max(next);
        }
        let held = self.progress.held(&self.topic);
        let seen = headway.observe(Instant::now(), &watermarks, &positions, &held);
        self.report(&seen, held.len());
        Some(seen)
    }

    async fn stored_positions(&self) -> Result<HashMap<i32, i64>, sqlx::Error> {
        // In a task of its own, with what it reads owned (as the consumer's flush does).
        let (pool, schema) = (self.idem.pool().clone(), self.schema.clone());
        let (group, topic) = (self.group.clone(), self.topic.clone());
        tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            store::alone(&mut conn, &schema, async |conn| {
                store::stored_offsets(conn, &schema, &group, &topic).await
            })
            .await
        })
        .await
        .unwrap_or_else(|joined| Err(sqlx::Error::Io(std::io::Error::other(joined))))
    }

    /// Whether the database answers (else a partition that does not move waits for it).
    async fn database_answers(&self) -> bool {
        // In a task of its own, with its pool owned.
        let pool = self.idem.pool().clone();
        let ping = tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            conn.ping().await?;
            Ok::<_, sqlx::Error>(())
        });
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Ok(Ok(())))
        )
    }

    fn report(&self, seen: &[PartitionHeadway], held: usize) {
        for partition in seen.iter().filter(|p| p.position > p.high_watermark) {
            tracing::warn!(
                group = %self.group, topic = %self.topic, partition = partition.partition,
                position = partition.position, high_watermark = partition.high_watermark,
                "the group's position is past the partition's last record: a position stored by hand, or a topic created again; records produced up to that position will not be consumed"
            );
        }
        for partition in seen {
            let labels = [
                ("group", self.group.clone()),
                ("topic", self.topic.clone()),
                ("partition", partition.partition.to_string()),
            ];
            metrics::gauge!("idem_kafka_partition_lag", &labels).set(partition.lag as f64);
            metrics::gauge!("idem_kafka_partition_still_seconds", &labels)
                .set(partition.still_for.as_secs_f64());
        }
        metrics::gauge!(
            "idem_kafka_partitions_held",
            "group" => self.group.clone(), "topic" => self.topic.clone(), "client" => self.client_id.clone()
        )
        .set(held as f64);
        self.stats.looked(seen.to_vec());
    }

    /// Warns of each stalled partition, again every stall bound while it stays stalled.
    fn warn_of_stalls(&self, seen: &[PartitionHeadway], episode: &mut Episode, now: Instant) {
        episode
            .warned
            .retain(|partition, _| seen.iter().any(|p| p.stalled && p.partition == *partition));
        for partition in seen.iter().filter(|p| p.stalled) {
            let due = episode
                .warned
                .get(&partition.partition)
                .is_none_or(|at| now.duration_since(*at) >= self.bounds.stall);
            if due {
                episode.warned.insert(partition.partition, now);
                tracing::warn!(
                    group = %self.group, topic = %self.topic, partition = partition.partition,
                    position = partition.position, high_watermark = partition.high_watermark,
                    lag = partition.lag, still_for = ?partition.still_for, held_here = partition.held,
                    "a partition with lag has not moved for longer than the stall bound ({:?}){}",
                    self.bounds.stall,
                    if partition.held { "" } else { ": no member here holds it" }
                );
            }
        }
    }

    /// Warns of stalled partitions and decides whether the member is stuck.
    async fn judge(
        &self,
        seen: &[PartitionHeadway],
        episode: &mut Episode,
        now: Instant,
    ) -> Verdict {
        self.warn_of_stalls(seen, episode, now);
        let held_stalled: Vec<i32> = seen
            .iter()
            .filter(|p| p.stalled && p.held)
            .map(|p| p.partition)
            .collect();
        let holds_nothing = seen.iter().all(|p| !p.held);
        let quiet_for = self.activity.quiet_for(now);
        // Stuck: a partition it holds stands still while the member waits for messages and
        // receives none; or it holds nothing while partitions stand still and the
        // database answers (an outage stops every partition, and is not the group's).
        let not_held: Vec<i32> = seen
            .iter()
            .filter(|p| p.stalled && !p.held)
            .map(|p| p.partition)
            .collect();
        // Stuck: a partition it holds stands still while the member waits for messages and
        // receives none; or it holds nothing while partitions stand still. Those give up in
        // the end: the member does nothing useful. Orphaned: partitions it does not hold
        // stand still while it works its own (a member that died without leaving, and a
        // broker that does not take its partitions back): a rejoin of a survivor hands
        // them out again, and the member goes on working whether or not it helps. Neither
        // counts while the database does not answer: an outage stops every partition, and
        // is not the group's.
        let (why, unproductive) = if !held_stalled.is_empty()
            && !self.activity.working.load(Ordering::Relaxed)
            && quiet_for > self.bounds.stall
        {
            (
                format!(
                    "partitions {held_stalled:?} of {} are assigned to this member and have lag, but it has received nothing for {quiet_for:?}",
                    self.topic,
                ),
                true,
            )
        } else if !not_held.is_empty() && self.database_answers().await {
            if holds_nothing {
                (
                    format!(
                        "this member holds no partition of {} while partitions {not_held:?} have lag and have not moved for longer than {:?}: the group's rebalance does not complete, or gives them to members that are gone or that do not consume them",
                        self.topic, self.bounds.stall
                    ),
                    true,
                )
            } else {
                (
                    format!(
                        "partitions {not_held:?} of {} have lag and have not moved for longer than {:?}, and no member here holds them: their member may be gone without leaving the group, or may not consume them",
                        self.topic, self.bounds.stall
                    ),
                    false,
                )
            }
        } else {
            *episode = Episode {
                warned: std::mem::take(&mut episode.warned),
                ..Episode::default()
            };
            return Verdict::Steady;
        };
        episode.since.get_or_insert(now);
        if unproductive
            && let Some(first) = episode.first_rejoin
            && now.duration_since(first) > self.bounds.give_up
        {
            return Verdict::GiveUp { why };
        }
        // A rejoin takes a rebalance or two: the next one no sooner than a stall bound later.
        let due = episode
            .last_rejoin
            .is_none_or(|last| now.duration_since(last) >= self.bounds.stall);
        if !due {
            return Verdict::Steady;
        }
        episode.rejoins += 1;
        episode.first_rejoin.get_or_insert(now);
        episode.last_rejoin = Some(now);
        Verdict::Rejoin {
            n: episode.rejoins,
            why,
        }
    }
}
