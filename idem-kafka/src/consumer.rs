//! The consumer-group member's loop: receives, gathers batches, hands them to the
//! [dispatcher](crate::dispatch), retries what can pass, commits what is done, leaves the
//! group.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use idem_runtime::Idem;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::context::GroupContext;
use crate::delivery::Delivery;
use crate::dispatch::{Dispatcher, Pending};
use crate::error::ConsumerError;
use crate::fate::Fate;
use crate::group_view::GroupView;
use crate::handler::Handler;
use crate::offset_store::OffsetStore;
use crate::position_behind::PositionBehind;
use crate::schema::{self, Schema};
use crate::settings::Settings;
use crate::stall_watch::{Activity, Bounds, StallWatch, Verdict};
use crate::stats::Stats;
use crate::store;

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
/// With a batch size above 1, the consumer takes up to that many messages (what arrives
/// within the batch linger of the first) and hands them to [`Handler::handle_batch`].
/// Their fates are routed in order up to the first message to retry: the messages before
/// it are done, and after the back-off that message is handled again on its own, then the
/// rest of the batch together.
pub struct Consumer<H> {
    consumer: StreamConsumer<GroupContext>,
    idem: Idem,
    settings: Settings,
    schema: Schema,
    stats: Arc<Stats>,
    dispatch: Dispatcher<H>,
    view: GroupView,
    activity: Arc<Activity>,
}

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
        let dispatch = Dispatcher {
            idem: idem.clone(),
            handler,
            group: settings.group.clone(),
            offsets: settings.offsets,
            schema: schema.clone(),
            progress: consumer.context().progress.clone(),
            receipts: Arc::default(),
        };
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

    /// Consumes until `shutdown` completes, then finishes the current message (or
    /// batch), commits what was processed and leaves the group. Bad messages and database
    /// outages do not end it.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ConsumerError> {
        let mut shutdown = pin!(shutdown);
        let mut tick = tokio::time::interval(self.settings.commit_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (verdicts, mut verdict) = watch::channel(Verdict::Steady);
        let watching = tokio::spawn(self.stall_watch().run(verdicts));
        tracing::info!(
            group = %self.settings.group, topic = %self.settings.topic, offsets = %self.settings.offsets,
            batch_size = self.settings.batch_size, "consumer started"
        );
        let mut stalled = None;
        // While rejoining: when to subscribe again.
        let mut resubscribe: Option<tokio::time::Instant> = None;
        loop {
            let first = tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = tick.tick() => {
                    self.save_progress().await;
                    continue;
                }
                () = wait_until(resubscribe) => {
                    resubscribe = None;
                    if let Err(error) = self.consumer.subscribe(&[&self.settings.topic]) {
                        tracing::warn!(%error, "subscribing again failed; retrying in a second");
                        resubscribe = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                    }
                    continue;
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
                    continue;
                }
                received = self.consumer.recv() => match received {
                    Ok(message) => Delivery::from_message(&message),
                    Err(error) => {
                        tracing::warn!(%error, "kafka reported an error; consuming on");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            self.activity.received();
            let deliveries = self.fill_batch(first).await;
            self.stats.received(deliveries.len());
            if !self.process(deliveries, shutdown.as_mut()).await {
                break;
            }
        }
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

    /// Adds to `first` what arrives within the batch linger, up to the batch size.
    ///
    /// Out of the `select!` of [`run`](Self::run): a message received here must not be
    /// dropped with a cancelled future.
    async fn fill_batch(&self, first: Delivery) -> Vec<Delivery> {
        let mut deliveries = vec![first];
        let deadline = tokio::time::Instant::now() + self.settings.batch_linger;
        while deliveries.len() < self.settings.batch_size {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Ok(Ok(message)) => {
                    self.activity.received();
                    deliveries.push(Delivery::from_message(&message));
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "kafka reported an error; consuming on");
                    break;
                }
                Err(_) => break,
            }
        }
        deliveries
    }

    /// Handles `deliveries`, retrying from the first one whose failure can pass. `false`
    /// if `shutdown` completed first: the unprocessed messages keep their offsets
    /// uncommitted.
    async fn process<F: Future<Output = ()>>(
        &self,
        deliveries: Vec<Delivery>,
        mut shutdown: Pin<&mut F>,
    ) -> bool {
        let pending: Vec<Pending> = deliveries.into_iter().map(Pending::new).collect();
        self.activity.working(true);
        let went_on = self.process_retrying(pending, shutdown.as_mut()).await;
        self.activity.working(false);
        went_on
    }

    /// [`process`](Self::process), the retries included.
    async fn process_retrying<F: Future<Output = ()>>(
        &self,
        mut pending: Vec<Pending>,
        mut shutdown: Pin<&mut F>,
    ) -> bool {
        let mut backoff = self.settings.retry_backoff;
        let mut attempt = 0u32;
        loop {
            let fates = if self.settings.batch_size <= 1 && pending.len() == 1 {
                vec![self.dispatch.handle_one(&pending[0].delivery).await]
            } else {
                // A retry takes the failing message on its own: if it fails again, the
                // messages behind it are not rolled back and redone one by one with it.
                let round = if attempt > 0 { 1 } else { pending.len() };
                self.stats.batch();
                self.dispatch.handle_round(&mut pending[..round]).await
            };
            let done = fates.iter().take_while(|fate| fate.is_final()).count();
            let mut fates = fates.into_iter();
            for (item, fate) in pending.drain(..done).zip(fates.by_ref()) {
                self.done(&item.delivery, &fate);
            }
            let Some(Fate::Retry { error, in_progress }) = fates.next() else {
                if pending.is_empty() {
                    return true;
                }
                // The retried message is done: the rest of the batch, together again.
                backoff = self.settings.retry_backoff;
                attempt = 0;
                continue;
            };
            if done > 0 {
                // A new message failed: its own back-off, and commit what is done.
                backoff = self.settings.retry_backoff;
                attempt = 0;
                self.save_progress().await;
            }
            // The failure may be the database's having gone back (a failover): then the
            // messages waiting here are read again from the stored positions.
            let waiting: Vec<&Delivery> = pending.iter().map(|item| &item.delivery).collect();
            if self.go_back_if_behind(&waiting).await {
                return true;
            }
            attempt += 1;
            self.stats.retried(in_progress);
            let at = &pending[0].delivery;
            tracing::warn!(
                topic = %at.topic, partition = at.partition, offset = at.offset, attempt,
                waiting = pending.len(), retry_in = ?backoff, %error, in_progress,
                "message not applied yet; retrying it (its offset stays uncommitted)"
            );
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = &mut shutdown => return false,
            }
            backoff = (backoff * 2).min(self.settings.max_retry_backoff);
        }
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
    async fn save_progress(&self) {
        match self.store_progress().await {
            Stored::Written => {}
            Stored::Nothing => {
                self.go_back_if_behind(&[]).await;
            }
            Stored::Failed => {
                self.go_back_if_behind(&[]).await;
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
    /// again (the others are duplicates). `waiting`: messages taken off the consumer and
    /// not done with, which are then dropped and read again. Returns whether it went back.
    async fn go_back_if_behind(&self, waiting: &[&Delivery]) -> bool {
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
            let offset = gone.stored.map_or(Offset::Beginning, Offset::Offset);
            seek.add_partition_offset(topic, gone.partition, offset)
                .ok();
        }
        // The other partitions of the messages dropped: read again from the first of them.
        let mut firsts: Vec<(&str, i32, i64)> = Vec::new();
        for delivery in waiting {
            if behind
                .iter()
                .any(|gone| delivery.topic == *topic && gone.partition == delivery.partition)
            {
                continue;
            }
            match firsts
                .iter_mut()
                .find(|(t, p, _)| *t == delivery.topic && *p == delivery.partition)
            {
                Some(first) => first.2 = first.2.min(delivery.offset),
                None => firsts.push((&delivery.topic, delivery.partition, delivery.offset)),
            }
        }
        for (t, partition, offset) in firsts {
            seek.add_partition_offset(t, partition, Offset::Offset(offset))
                .ok();
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
