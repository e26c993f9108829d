//! The consumer-group member's loop: receives, routes each message to its partition's
//! [lane](crate::lanes), starts [workers](crate::worker) on the lanes' deliveries, marks
//! what they are done with, commits it, hands partitions over on rebalances, leaves the
//! group.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use idem_runtime::Idem;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::context::{GroupContext, list_of};
use crate::delivery::Delivery;
use crate::dispatch::Dispatcher;
use crate::error::ConsumerError;
use crate::fate::Fate;
use crate::group_view::GroupView;
use crate::handler::Handler;
use crate::handover::{Handed, Key};
use crate::lanes::Lanes;
use crate::offset_store::OffsetStore;
use crate::position_behind::PositionBehind;
use crate::schema::{self, Schema};
use crate::settings::Settings;
use crate::stall_watch::{Activity, Bounds, StallWatch, Verdict};
use crate::stats::Stats;
use crate::store;
use crate::worker::{Report, Workers};

/// A member of a Kafka consumer group that hands every message (or batch of messages) to
/// a [`Handler`].
///
/// Per message, in partition order: decode the payload; hand it to the handler (its
/// effects and the key's `success` commit in one transaction, or the key was handled
/// before); only then mark the message's offset as processed. Processed offsets are
/// committed every commit interval, when partitions are revoked (rebalance) and at
/// shutdown; with [`OffsetStore::Postgres`] they are stored in PostgreSQL first, by the
/// handler's transaction where it does so, and read back on partition assignment.
///
/// A message that can never be handled ([`Fate::DeadLetter`], or undecodable) is written
/// to the dead-letter table with its raw bytes, the error and its coordinates, and the
/// consumer moves on. A failure that can pass ([`Fate::Retry`]: the database is down, the
/// key is being processed elsewhere, a handler error that is not final yet) is retried on
/// the same message with a growing back-off: the partition waits, nothing is skipped and
/// no offset at or after it is committed.
///
/// With a batch size above 1, the consumer takes up to that many messages of a partition
/// (what arrives within the batch linger of the first) and hands them to
/// [`Handler::handle_batch`]. Their fates are routed in order up to the first message to
/// retry: the messages before it are done, and after the back-off that message is handled
/// again on its own, then the rest of the batch together.
///
/// The member works the partitions it holds in parallel: at most one delivery (a message
/// or a batch) of each partition at a time, in partition order, and at most
/// [`max_in_flight`](crate::ConsumerBuilder::max_in_flight) deliveries at once, each on a
/// connection of the [`Idem`] pool. A partition waiting in back-off holds up no other.
pub struct Consumer<H> {
    consumer: StreamConsumer<GroupContext>,
    idem: Idem,
    settings: Settings,
    schema: Schema,
    stats: Arc<Stats>,
    dispatch: Arc<Dispatcher<H>>,
    view: GroupView,
    activity: Arc<Activity>,
    /// Deliveries worked at once (the setting, within the pool's size).
    max_in_flight: usize,
}

/// What the loop of [`Consumer::run`] keeps: the lanes, the workers' tasks, the
/// revocations that wait for deliveries in flight.
struct Member<H> {
    lanes: Lanes,
    /// Dropped with the loop (a kill aborts the task running it): the workers end with it.
    tasks: JoinSet<()>,
    /// Revoked partitions (and whether incrementally) whose deliveries are finishing.
    revoking: Vec<(Vec<Key>, bool)>,
    workers: Workers<H>,
}

/// What the reports of the workers call for, once they are applied.
#[derive(Debug, Default)]
struct After {
    /// Messages are done before one to retry: flush.
    flush: bool,
    /// A message is retried: look whether the database went back.
    retrying: bool,
}

/// Messages the lanes of a member's fetching partitions queue together before its loop
/// holds back (or twenty batches, if more; see [lanes](crate::lanes)). Holding back, not
/// pausing: a pause drops what librdkafka had fetched ahead for the partition, fetched
/// again on resume, and pausing at a bound per partition ran the batch path at half its
/// rate once the topic was larger than the bounds.
const QUEUED_PER_MEMBER: usize = 10_000;

impl<H> fmt::Debug for Consumer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> Consumer<H> {
    pub(crate) fn create(
        idem: Idem,
        settings: Settings,
        schema: Schema,
        stats: Arc<Stats>,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        let context = GroupContext::new(
            settings.group.clone(),
            settings.offsets,
            schema.clone(),
            idem.pool().connect_options().as_ref().clone(),
        );
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group)
            .set("client.id", &settings.client_id)
            // Offsets are committed by this code, and only for processed messages.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set(
                "session.timeout.ms",
                settings.session_timeout.as_millis().to_string(),
            )
            .set(
                "heartbeat.interval.ms",
                settings.heartbeat_interval().as_millis().to_string(),
            );
        for (name, value) in &settings.extra {
            client.set(name, value);
        }
        let consumer: StreamConsumer<GroupContext> = client.create_with_context(context)?;
        consumer.subscribe(&[&settings.topic])?;
        let dispatch = Arc::new(Dispatcher {
            idem: idem.clone(),
            handler,
            group: settings.group.clone(),
            offsets: settings.offsets,
            schema: schema.clone(),
            progress: consumer.context().progress.clone(),
        });
        let max_in_flight = settings.max_in_flight(idem.pool().options().get_max_connections());
        let view = GroupView::new(
            &settings.brokers,
            &settings.group,
            &settings.topic,
            &settings.client_id,
            &settings.extra,
        )?;
        Ok(Consumer {
            consumer,
            idem,
            settings,
            schema,
            stats,
            dispatch,
            view,
            activity: Arc::default(),
            max_in_flight,
        })
    }

    /// Creates the schema of the offset and dead-letter tables if needed and applies
    /// their migrations ([`migrate`](crate::migrate)). Safe to call from every consumer
    /// at start-up.
    pub async fn migrate(&self) -> Result<(), ConsumerError> {
        schema::migrate(&self.idem, &self.schema).await
    }

    /// The schema of the offset and dead-letter tables.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The consumer's counters (shared with the other consumers given the same
    /// [`Stats`]).
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// A switch that makes this consumer stop as if it had crashed (`test-util`).
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn kill_switch(&self) -> crate::test_util::KillSwitch {
        crate::test_util::KillSwitch::new(self.consumer.context().killed.clone())
    }

    /// Consumes until `shutdown` completes, then finishes the deliveries in flight (each
    /// partition's current message or batch), commits what was processed and leaves the
    /// group. Bad messages and database outages do not end it.
    ///
    /// The member works in a task of its own, spawned on the current Tokio runtime (a
    /// multi-threaded one, as `#[tokio::main]` builds, lets it work beside its deliveries);
    /// dropping the future that `run` returns stops it at once, as a crash would: nothing
    /// in flight is committed.
    ///
    /// At a rebalance the member waits, as librdkafka's callback must, for PostgreSQL (the
    /// stored offsets of the partitions it gets, the positions of those it gives up) and
    /// the broker (their commit). On a multi-threaded runtime the worker's other tasks
    /// move to another thread meanwhile; on a current-thread runtime, everything on it
    /// waits too, so nothing the member needs to reach the database may run there (an
    /// in-process tunnel or proxy).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ConsumerError> {
        // The loop is woken at every message and every delivery's report. In a task on the
        // runtime's workers, beside the deliveries' tasks, that costs no wake-up of another
        // thread; awaited where `run` is called (often `block_on`'s thread, which only
        // `#[tokio::main]`'s future runs on), every one of them would.
        let (stop, stopped) = oneshot::channel::<()>();
        let member = self
            .member(async move {
                stopped.await.ok();
            })
            .instrument(tracing::Span::current());
        let mut member = AbortOnDropHandle::new(tokio::spawn(member));
        let mut shutdown = pin!(shutdown);
        let mut stop = Some(stop);
        loop {
            tokio::select! {
                ended = &mut member => {
                    return match ended {
                        Ok(ended) => ended,
                        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                        Err(error) => Err(ConsumerError::Close(error)),
                    };
                }
                () = &mut shutdown, if stop.is_some() => {
                    if let Some(stop) = stop.take() {
                        stop.send(()).ok();
                    }
                }
            }
        }
    }

    /// The member's loop (see [`run`](Self::run)).
    async fn member(self, shutdown: impl Future<Output = ()>) -> Result<(), ConsumerError> {
        let mut shutdown = pin!(shutdown);
        let mut tick = tokio::time::interval(self.settings.commit_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (verdicts, mut verdict) = watch::channel(Verdict::Steady);
        let watching = tokio::spawn(self.stall_watch().run(verdicts));
        tracing::info!(
            group = %self.settings.group, topic = %self.settings.topic, offsets = %self.settings.offsets,
            batch_size = self.settings.batch_size, max_in_flight = self.max_in_flight,
            "consumer started"
        );
        let (reports_to, mut reports) = mpsc::unbounded_channel();
        let workers = Workers {
            dispatch: self.dispatch.clone(),
            permits: Arc::new(Semaphore::new(self.max_in_flight)),
            reports: reports_to,
            stats: self.stats.clone(),
            batch_size: self.settings.batch_size,
            retry_backoff: self.settings.retry_backoff,
            max_retry_backoff: self.settings.max_retry_backoff,
        };
        let mut member = Member {
            lanes: Lanes::new(
                self.settings.batch_size,
                self.settings.batch_linger,
                (self.settings.batch_size * 20).max(QUEUED_PER_MEMBER),
            ),
            tasks: JoinSet::new(),
            revoking: Vec::new(),
            workers,
        };
        let handover = &self.consumer.context().handover;
        let mut stalled = None;
        // While rejoining: when to subscribe again.
        let mut resubscribe: Option<tokio::time::Instant> = None;
        loop {
            self.take_handed(&mut member);
            self.give_up_revoked(&mut member);
            self.start_ready(&mut member);
            let due = member.lanes.next_due();
            let revoking = !member.revoking.is_empty();
            let reading = member.lanes.reading(tokio::time::Instant::now());
            let hold_ends = member.lanes.hold_ends();
            // Unbiased: a steady stream of messages must not starve the workers' reports,
            // nor the reports the stream.
            tokio::select! {
                () = &mut shutdown => break,
                Some(report) = reports.recv() => {
                    let mut after = After::default();
                    self.apply(report, &mut member, &mut after);
                    // What else is there, at once: one flush and one look for them all.
                    while let Ok(report) = reports.try_recv() {
                        self.apply(report, &mut member, &mut after);
                    }
                    if after.flush {
                        self.save_progress(&mut member.lanes).await;
                    }
                    if after.retrying {
                        self.go_back_if_behind(&mut member.lanes).await;
                    }
                }
                Some(joined) = member.tasks.join_next() => {
                    if let Err(error) = joined && error.is_panic() {
                        std::panic::resume_unwind(error.into_panic());
                    }
                }
                _ = tick.tick() => {
                    self.save_progress(&mut member.lanes).await;
                }
                () = wait_until(resubscribe) => {
                    resubscribe = None;
                    if let Err(error) = self.consumer.subscribe(&[&self.settings.topic]) {
                        tracing::warn!(%error, "subscribing again failed; retrying in a second");
                        resubscribe = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                    }
                }
                Ok(()) = verdict.changed() => {
                    match verdict.borrow_and_update().clone() {
                        Verdict::Steady => {}
                        Verdict::Rejoin { n, why } => {
                            if resubscribe.is_none() {
                                self.leave(n, &why);
                                resubscribe = Some(tokio::time::Instant::now() + REJOIN_PAUSE);
                            }
                        }
                        Verdict::GiveUp { why } => {
                            stalled = Some(why);
                            break;
                        }
                    }
                }
                () = handover.handed() => {}
                () = wait_until(due) => {}
                () = wait_until(hold_ends) => self.pause_held(&mut member.lanes),
                // Not while a revocation waits for its deliveries: librdkafka waits for its
                // unassign call, and serves no other rebalance meanwhile.
                // Nor while the lanes hold their bound: librdkafka keeps what it fetches
                // meanwhile, within its own bounds.
                received = handover.polling(self.consumer.recv()), if !revoking && reading => match received {
                    Ok(message) => {
                        let delivery = Delivery::from_message(&message);
                        drop(message);
                        self.activity.received();
                        self.stats.received(1);
                        // The callback may have changed the assignment before this message.
                        self.take_handed(&mut member);
                        self.route(delivery, &mut member.lanes);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "kafka reported an error; consuming on");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        // Stopping: the deliveries in flight finish (a back-off ends at once), nothing
        // queued starts.
        member.lanes.stop_all();
        while member.lanes.any_running() {
            tokio::select! {
                Some(report) = reports.recv() => {
                    self.apply(report, &mut member, &mut After::default());
                }
                Some(joined) = member.tasks.join_next() => {
                    if let Err(error) = joined && error.is_panic() {
                        std::panic::resume_unwind(error.into_panic());
                    }
                }
            }
        }
        self.activity.working(false);
        self.take_handed(&mut member);
        self.give_up_revoked(&mut member);
        watching.abort();
        if let Some(why) = &stalled {
            tracing::error!(group = %self.settings.group, topic = %self.settings.topic, "{why}; rejoining the group did not help: stopping, for the supervisor to start this member again");
        }
        self.close().await?;
        match stalled {
            None => Ok(()),
            Some(why) => Err(ConsumerError::Stalled(why)),
        }
    }

    /// Applies what the rebalance callback handed over, in order.
    fn take_handed(&self, member: &mut Member<H>) {
        for handed in self.consumer.context().handover.take() {
            match handed {
                Handed::Assigned(keys) => member.lanes.assigned(&keys),
                Handed::Revoked(keys) => member.lanes.remove(&keys),
                Handed::Revoking {
                    partitions,
                    cooperative,
                } => {
                    member.lanes.revoking(&partitions);
                    member.revoking.push((partitions, cooperative));
                }
                Handed::Dropped => member.lanes.reset_all(),
            }
        }
    }

    /// Gives up the revoked partitions whose deliveries are done: saves their progress
    /// and makes the unassign call librdkafka waits for.
    fn give_up_revoked(&self, member: &mut Member<H>) {
        let context = self.consumer.context();
        let lanes = &mut member.lanes;
        member.revoking.retain(|(keys, cooperative)| {
            if lanes.any_running_of(keys) {
                return true;
            }
            lanes.remove(keys);
            context.give_up(&self.consumer, &list_of(keys), *cooperative);
            false
        });
    }

    /// Hands the deliveries that can start to workers.
    fn start_ready(&self, member: &mut Member<H>) {
        let handover = &self.consumer.context().handover;
        for ready in member.lanes.ready(tokio::time::Instant::now()) {
            handover.set_busy(&ready.key, true);
            member.tasks.spawn(member.workers.clone().work(ready));
        }
        // Partitions whose lanes worked off their queues fetch again.
        let resumed = member.lanes.take_resumable();
        if !resumed.is_empty()
            && let Err(error) = self.consumer.resume(&list_of(&resumed))
        {
            tracing::warn!(%error, "resuming partitions failed");
        }
        self.activity.working(member.lanes.any_running());
    }

    /// Queues a message in its partition's lane.
    fn route(&self, delivery: Delivery, lanes: &mut Lanes) {
        lanes.route(delivery, tokio::time::Instant::now());
    }

    /// The loop held back for [`HOLD_BEFORE_PAUSE`](crate::lanes::HOLD_BEFORE_PAUSE):
    /// pauses the partitions with queued messages, so that it reads again.
    fn pause_held(&self, lanes: &mut Lanes) {
        let held = lanes.pause_held();
        if !held.is_empty()
            && let Err(error) = self.consumer.pause(&list_of(&held))
        {
            tracing::warn!(%error, partitions = ?held, "pausing partitions failed");
        }
    }

    /// Applies a worker's report: the messages it is done with are processed (unless its
    /// lane was reset since).
    fn apply(&self, report: Report, member: &mut Member<H>, after: &mut After) {
        match report {
            Report::Done {
                key,
                generation,
                done,
                receipts,
                retrying,
            } => {
                if !member.lanes.is_current(&key, generation) {
                    return;
                }
                // What the round's batch transactions stored is what PostgreSQL holds now.
                self.consumer.context().progress.confirm(&receipts);
                if retrying.is_some() {
                    // A new message failed: commit what is done. The failure may be the
                    // database's having gone back (a failover).
                    after.flush |= !done.is_empty();
                    after.retrying = true;
                }
                for (delivery, fate) in &done {
                    self.done(delivery, fate);
                }
            }
            Report::Finished { key, generation } => {
                member.lanes.finished(&key, generation);
                if !member.lanes.any_running_of(std::slice::from_ref(&key)) {
                    self.consumer.context().handover.set_busy(&key, false);
                }
            }
        }
    }

    /// The watch over the group's headway (see [`ConsumerBuilder::stall_bound`]).
    fn stall_watch(&self) -> StallWatch {
        let stall = self.settings.stall_bound();
        StallWatch {
            view: self.view.clone(),
            idem: self.idem.clone(),
            schema: self.schema.clone(),
            group: self.settings.group.clone(),
            topic: self.settings.topic.clone(),
            client_id: self.settings.client_id.clone(),
            offsets: self.settings.offsets,
            progress: self.consumer.context().progress.clone(),
            activity: self.activity.clone(),
            stats: self.stats.clone(),
            bounds: Bounds {
                every: (stall / 3).clamp(Duration::from_secs(1), Duration::from_secs(10)),
                stall,
                give_up: stall * 2,
            },
        }
    }

    /// Leaves the group, to join it again after [`REJOIN_PAUSE`]: the member's partitions
    /// are revoked (their progress saved), and the loop goes on polling meanwhile, so that
    /// the client really sends its LeaveGroup (a subscription renewed at once, while a
    /// rebalance is in progress, is only a change of subscription).
    fn leave(&self, n: u32, why: &str) {
        tracing::warn!(
            group = %self.settings.group, topic = %self.settings.topic, rejoin = n,
            "{why}: leaving the group and joining it again"
        );
        metrics::counter!(
            "idem_kafka_rejoins_total",
            "group" => self.settings.group.clone(), "topic" => self.settings.topic.clone()
        )
        .increment(1);
        self.consumer.unsubscribe();
    }

    /// A message is done with (its fate is final): marks its offset processed and counts
    /// it.
    fn done(&self, at: &Delivery, fate: &Fate) {
        // Stored already: by the transaction of a single message's dead letter, or of a
        // handler that stores its position.
        let stored_in_tx = self.settings.offsets == OffsetStore::Postgres
            && self.settings.batch_size <= 1
            && match fate {
                Fate::DeadLetter { .. } => true,
                Fate::Executed => self.dispatch.handler.stores_position(),
                _ => false,
            };
        self.consumer.context().progress.processed(
            &at.topic,
            at.partition,
            at.offset,
            stored_in_tx,
        );
        self.stats
            .processed(&at.topic, at.partition, at.offset, fate);
    }

    /// Stores the processed positions that are not stored yet (Postgres variant) and
    /// commits them to Kafka, without waiting for the broker. Postgres variant: when there
    /// was nothing to store, or storing failed, reads the stored positions back, and goes
    /// back to them where the database went back (a failover while this member had
    /// nothing to write would otherwise go unseen).
    async fn save_progress(&self, lanes: &mut Lanes) {
        match self.store_progress().await {
            Stored::Written => {}
            Stored::Nothing => {
                self.go_back_if_behind(lanes).await;
            }
            Stored::Failed => {
                self.go_back_if_behind(lanes).await;
                return;
            }
        }
        let context = self.consumer.context();
        context.commit(&self.consumer, CommitMode::Async);
    }

    /// Postgres variant: stores the processed positions that are not stored yet. Kafka's
    /// committed offsets never go ahead of PostgreSQL: not after [`Stored::Failed`].
    async fn store_progress(&self) -> Stored {
        let context = self.consumer.context();
        if context.killed() {
            return Stored::Failed;
        }
        if self.settings.offsets != OffsetStore::Postgres {
            return Stored::Written;
        }
        let pending = context.progress.unstored();
        if pending.is_empty() {
            return Stored::Nothing;
        }
        // In a task of its own: a transaction that `alone` begins must not be dropped while
        // `BEGIN` is in flight (sqlx 0.8 would hand its connection back to the pool
        // inside it).
        let stored = tokio::spawn({
            let (pool, schema) = (self.idem.pool().clone(), self.schema.clone());
            let (group, pending) = (self.settings.group.clone(), pending.clone());
            async move {
                let mut conn = pool.acquire().await?;
                store::alone(&mut conn, &schema, async |conn| {
                    store::store_positions(conn, &schema, &group, &pending).await
                })
                .await
            }
        })
        .await
        .unwrap_or_else(|joined| Err(sqlx::Error::Io(std::io::Error::other(joined))));
        match stored {
            Ok(()) => {
                context.progress.confirm(&pending);
                Stored::Written
            }
            Err(error) => {
                tracing::warn!(%error, "storing offsets in postgres failed; retrying at the next commit");
                context.progress.unstore(&pending);
                Stored::Failed
            }
        }
    }

    /// Postgres variant: reads the positions stored for the topic and, for each partition
    /// whose stored position is behind one this member saw committed (the database lost
    /// commits: a failover to a standby that lagged, a restore), starts that partition over
    /// from the stored position, so that the messages whose effects were lost are handled
    /// again (the others are duplicates): its lane drops what it queued, its worker stops
    /// (after the attempt in flight), and the partition is read again from there. Returns
    /// whether it went back.
    async fn go_back_if_behind(&self, lanes: &mut Lanes) -> bool {
        let progress = &self.consumer.context().progress;
        if self.settings.offsets != OffsetStore::Postgres || !progress.knows_stored() {
            return false;
        }
        // In a task of its own, as in `store_progress`.
        let stored = tokio::spawn({
            let (pool, schema) = (self.idem.pool().clone(), self.schema.clone());
            let (group, topic) = (self.settings.group.clone(), self.settings.topic.clone());
            async move {
                let mut conn = pool.acquire().await?;
                store::alone(&mut conn, &schema, async |conn| {
                    store::stored_offsets(conn, &schema, &group, &topic).await
                })
                .await
            }
        })
        .await
        .unwrap_or_else(|joined| Err(sqlx::Error::Io(std::io::Error::other(joined))));
        let stored = match stored {
            Ok(stored) => stored,
            Err(error) => {
                tracing::debug!(%error, "cannot read the stored offsets back; checking again later");
                return false;
            }
        };
        let topic = &self.settings.topic;
        let behind = progress.behind(topic, &stored);
        if behind.is_empty() {
            return false;
        }
        let mut seek = TopicPartitionList::new();
        let mut paused = Vec::new();
        for gone in &behind {
            let error = PositionBehind {
                topic: topic.clone(),
                partition: gone.partition,
                stored: gone.stored,
                known: gone.known,
            };
            tracing::warn!(
                topic = %topic, partition = gone.partition, stored = ?gone.stored, known = gone.known,
                "{error}"
            );
            metrics::counter!("idem_kafka_position_rewinds_total", "topic" => topic.clone())
                .increment(1);
            progress.rewind(topic, gone.partition, gone.stored);
            self.stats
                .rewound(topic, gone.partition, gone.stored.unwrap_or(0));
            let key = (topic.clone(), gone.partition);
            if lanes.reset(&key) {
                paused.push(key);
            }
            let offset = gone.stored.map_or(Offset::Beginning, Offset::Offset);
            seek.add_partition_offset(topic, gone.partition, offset)
                .ok();
        }
        // Resumed first: a resume goes on from the last message received, the seek then
        // from the stored position.
        if !paused.is_empty() {
            self.consumer.resume(&list_of(&paused)).ok();
        }
        // Without waiting: the seek's barrier drops what was fetched before it at once.
        if let Err(error) = self.consumer.seek_partitions(seek, Duration::ZERO) {
            tracing::warn!(%error, "seeking back to the stored offsets failed");
        }
        true
    }

    /// Saves the progress (synchronously) and leaves the group.
    async fn close(self) -> Result<(), ConsumerError> {
        let commit_too = self.store_progress().await != Stored::Failed;
        let Consumer {
            consumer, settings, ..
        } = self;
        // Committing synchronously and leaving the group block: not on the runtime's threads.
        tokio::task::spawn_blocking(move || {
            if commit_too {
                consumer.context().commit(&consumer, CommitMode::Sync);
            }
            drop(consumer);
            tracing::info!(group = %settings.group, "consumer stopped");
        })
        .await?;
        Ok(())
    }
}

/// What storing the processed positions did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// Stored (or nothing to store: offsets in Kafka).
    Written,
    /// Offsets in PostgreSQL, and nothing new to store.
    Nothing,
    /// Not stored (or killed): nothing may be committed to Kafka.
    Failed,
}

/// How long a member that leaves its group to rejoin it keeps polling before it
/// subscribes again: long enough for the revocation and the LeaveGroup to go out.
const REJOIN_PAUSE: Duration = Duration::from_secs(2);

/// Completes at `at`, never without one.
async fn wait_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
