//! A consumer-group member that hands every message to a [`MessageHandler`]: the order
//! events' `#[idempotent]` handlers ([`OrderConsumer`]), or the lease-mode notification
//! step ([`notifications`](super::notifications)).
//!
//! Per message, in partition order:
//!
//! 1. decode the payload (JSON, with serde);
//! 2. hand it to the handler: for the order events, the business effects and the key's
//!    `success` commit in one transaction, or the key was already applied (a duplicate);
//! 3. only then mark the message's offset as processed. Processed offsets are committed
//!    to Kafka every [`ConsumerConfig::commit_interval`], when partitions are revoked
//!    (rebalance) and at shutdown.
//!
//! A message that can never be handled (undecodable, no key, a key first applied with
//! another payload, a parked key) is written to the dead-letter table with its raw bytes,
//! the error and its coordinates, and the consumer moves on. A failure that can pass (the
//! database is down, the key is being processed elsewhere, a handler error that is not
//! final yet) is retried on the same message with a growing back-off: consumption pauses,
//! nothing is skipped, and the offset is not committed meanwhile.
//!
//! With [`OffsetStore::Postgres`], the partition's next offset is written by the handler's
//! transaction itself (for the order events, [`apply_order_event_at`]) and read back on
//! partition assignment, see [`offsets`].
//!
//! # The batch path
//!
//! With [`ConsumerConfig::batch_size`] above 1, the consumer takes up to that many
//! messages (what arrives within [`ConsumerConfig::batch_linger`] of the first) and hands
//! them to [`MessageHandler::apply_batch`]: for the order events, one transaction claims
//! all keys, runs the new ones and commits once ([`apply_order_event_batch`]). Each
//! message's verdict is then routed as on the per-message path, in order, up to the first
//! message that must be retried: the messages before it are processed (their offsets may
//! be committed), and after the back-off that message is applied again on its own, then
//! the rest of the batch together. Messages behind it that did run meanwhile are
//! duplicates then, and count as applied.
//! Undecodable messages are dead-lettered before the batch transaction.
//!
//! [`apply_order_event_at`]: super::handlers::apply_order_event_at
//! [`apply_order_event_batch`]: super::handlers::apply_order_event_batch

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_runtime::{Disposition, Idem, Outcome};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use super::dead_letter::{self, Reason};
use super::handlers::OrderEvents;
use super::offsets::{self, Position};
use super::{Coordinates, Delivery};

/// Where a consumer keeps the offsets it has processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetStore {
    /// Committed to Kafka after the handler's transaction committed. After a crash, the
    /// messages processed since the last commit are delivered again (and skipped as
    /// duplicates).
    #[default]
    Kafka,
    /// Written to PostgreSQL by the handler's transaction (and committed to Kafka as well,
    /// for lag monitoring only). After a crash, at most the in-flight message (or batch)
    /// and the duplicates read since the last flush are delivered again.
    Postgres,
}

impl fmt::Display for OffsetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OffsetStore::Kafka => "kafka",
            OffsetStore::Postgres => "postgres",
        })
    }
}

impl FromStr for OffsetStore {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "kafka" => Ok(OffsetStore::Kafka),
            "postgres" => Ok(OffsetStore::Postgres),
            other => Err(format!(
                "unknown offset store `{other}`; expected `kafka` or `postgres`"
            )),
        }
    }
}

/// The settings of one consumer.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The consumer group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// This member's client id (shows in broker logs).
    pub client_id: String,
    /// Where processed offsets are kept.
    pub offsets: OffsetStore,
    /// Messages handed to the handler together (default 1: one message, one transaction).
    /// Above 1, [`MessageHandler::apply_batch`] gets up to this many.
    pub batch_size: usize,
    /// How long a batch waits for more messages after its first one (default 20 ms).
    pub batch_linger: Duration,
    /// How often processed offsets are committed (default 1 s).
    pub commit_interval: Duration,
    /// The first wait before retrying a message that failed in a way that can pass
    /// (default 50 ms); it doubles on every failure of the same message.
    pub retry_backoff: Duration,
    /// The longest wait between two retries of a message (default 5 s).
    pub max_retry_backoff: Duration,
    /// The group's session timeout: how long the broker waits for a silent member before
    /// it gives the member's partitions to the others (default 10 s).
    pub session_timeout: Duration,
    /// Further librdkafka settings, applied last.
    pub extra: Vec<(String, String)>,
}

impl ConsumerConfig {
    /// The defaults for `group` reading `topic` from `brokers`.
    pub fn new(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
    ) -> Self {
        let group = group.into();
        ConsumerConfig {
            brokers: brokers.into(),
            client_id: format!("{group}-member"),
            group,
            topic: topic.into(),
            offsets: OffsetStore::Kafka,
            batch_size: 1,
            batch_linger: Duration::from_millis(20),
            commit_interval: Duration::from_secs(1),
            retry_backoff: Duration::from_millis(50),
            max_retry_backoff: Duration::from_secs(5),
            session_timeout: Duration::from_secs(10),
            extra: Vec::new(),
        }
    }
}

/// Why a consumer could not start or stop cleanly. Message-level failures never end up
/// here: they are retried or dead-lettered.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The Kafka client failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// PostgreSQL failed at start-up.
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    /// The consumer's closing task failed.
    #[error("closing the consumer failed: {0}")]
    Close(#[from] tokio::task::JoinError),
}

/// What a handler made of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The handler ran and its effects are done.
    Executed,
    /// The message's key had already been handled: nothing ran.
    Duplicate,
    /// The message needs nothing from this handler (an event it does not act on).
    Skipped,
    /// Retrying cannot help: the consumer writes the message to the dead-letter table.
    DeadLetter {
        /// Why.
        reason: Reason,
        /// The error, with its sources.
        error: String,
    },
    /// The failure can pass: the consumer handles the message again after a back-off,
    /// without committing its offset.
    Retry {
        /// The error, with its sources.
        error: String,
        /// Whether another delivery holds the key ([`idem_runtime::Error::InProgress`]):
        /// its transaction, or its lease in lease mode.
        in_progress: bool,
    },
}

impl Verdict {
    /// The verdict on what an `#[idempotent]` handler returned: outcomes are executed or
    /// duplicates, errors go by their [`Disposition`].
    pub fn of<T, E>(outcome: Result<Outcome<T>, idem_runtime::Error<E>>) -> Self
    where
        E: std::error::Error + 'static,
    {
        match outcome {
            Ok(Outcome::Executed(_)) => Verdict::Executed,
            Ok(Outcome::Duplicate(_)) => Verdict::Duplicate,
            Err(error) => match error.disposition() {
                Disposition::DeadLetter => Verdict::DeadLetter {
                    reason: Reason::of(&error),
                    error: error_chain(&error),
                },
                Disposition::Retry => Verdict::Retry {
                    in_progress: matches!(error, idem_runtime::Error::InProgress { .. }),
                    error: error_chain(&error),
                },
                // A deployment error (two handlers on one scope): nothing is committed past
                // the message, and the error is logged at every retry.
                _ => {
                    tracing::error!(error = %error_chain(&error), "the handler cannot run: fix the deployment");
                    Verdict::Retry {
                        in_progress: false,
                        error: error_chain(&error),
                    }
                }
            },
        }
    }
}

/// What a consumer does with the messages it receives: decode them, and hand them to an
/// `#[idempotent]` handler. The consumer does the rest (offsets, dead letters, retries,
/// rebalances, shutdown).
pub trait MessageHandler: Send + Sync + 'static {
    /// A decoded message.
    type Message: Send + Sync + 'static;

    /// Decodes a payload; `Err` (the reason) dead-letters the message as undecodable.
    fn decode(&self, payload: &[u8]) -> Result<Self::Message, String>;

    /// Handles one message. With offsets in PostgreSQL, `position` is the partition's
    /// position after the message, for a handler that stores it in the transaction of
    /// its effects (see [`stores_position`](Self::stores_position)).
    fn apply(
        &self,
        idem: &Idem,
        message: &Self::Message,
        position: Option<&Position>,
    ) -> impl Future<Output = Verdict> + Send;

    /// Whether [`apply`](Self::apply) writes `position` in the transaction of its
    /// effects when it executes. If not, the consumer records the position with its next
    /// flush (every commit interval).
    fn stores_position(&self) -> bool {
        false
    }

    /// Handles several messages (the batch path); returns one verdict per message, in
    /// order, or fewer: the messages without a verdict are handled again later. With
    /// offsets in PostgreSQL, `positions` holds each message's position after it.
    ///
    /// Whatever the handler stores of `positions` must never pass a message that is not
    /// done when its transaction commits: one to be dead-lettered after the batch, or one
    /// to be retried (the positions of the order events' batch stop there, see
    /// [`BatchOffsets`](super::offsets::BatchOffsets)).
    ///
    /// The default handles the messages one by one and stops after the first one to
    /// retry; it stores no position (the consumer's flush does).
    fn apply_batch(
        &self,
        idem: &Idem,
        messages: &[Self::Message],
        positions: Option<&[Position]>,
    ) -> impl Future<Output = Vec<Verdict>> + Send {
        let _ = positions;
        async move {
            let mut verdicts = Vec::with_capacity(messages.len());
            for message in messages {
                let verdict = self.apply(idem, message, None).await;
                let retry = matches!(verdict, Verdict::Retry { .. });
                verdicts.push(verdict);
                if retry {
                    break;
                }
            }
            verdicts
        }
    }
}

/// Counters of one or several consumers (share one `Arc<Stats>` between them).
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
    positions: Mutex<HashMap<(String, i32), i64>>,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Messages received from Kafka, redeliveries and duplicates included.
    pub deliveries: u64,
    /// Deliveries whose handler ran and completed its effects.
    pub executed: u64,
    /// Deliveries of keys that had already been handled: skipped.
    pub duplicates: u64,
    /// Deliveries the handler had nothing to do for (events it does not act on).
    pub skipped: u64,
    /// Deliveries written to the dead-letter table.
    pub dead_letters: u64,
    /// Retries of a message (or of the rest of a batch) after a failure that can pass
    /// (database down, key in progress elsewhere, ...).
    pub retries: u64,
    /// Those of the retries whose key was held by another delivery (`InProgress`).
    pub in_progress: u64,
    /// Transactions (or rounds of the handler) that took several messages together.
    pub batches: u64,
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
        }
    }

    /// Whether every partition of `topic` in `end_offsets` (partition -> offset after the
    /// last message) has been processed to its end by one of the consumers.
    pub fn caught_up(&self, topic: &str, end_offsets: &HashMap<i32, i64>) -> bool {
        caught_up([self], topic, end_offsets)
    }

    /// Per partition, the offset after the last message processed.
    pub fn positions(&self) -> HashMap<(String, i32), i64> {
        lock(&self.positions).clone()
    }

    fn processed(&self, at: &Coordinates, applied: Applied) {
        let counter = match applied {
            Applied::Executed => &self.executed,
            Applied::Duplicate => &self.duplicates,
            Applied::Skipped => &self.skipped,
            Applied::DeadLettered => &self.dead_letters,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut positions = lock(&self.positions);
        let next = positions
            .entry((at.topic.clone(), at.partition))
            .or_insert(0);
        *next = (*next).max(at.offset + 1);
    }

    fn retried(&self, retry: &RetryLater) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        if retry.in_progress {
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

/// What happened to one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The handler ran and its effects are done.
    Executed,
    /// The key had already been handled: nothing ran.
    Duplicate,
    /// The handler had nothing to do for it.
    Skipped,
    /// The message went to the dead-letter table.
    DeadLettered,
}

/// Why a message is handled again later: the error, and whether its key was held by
/// another delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryLater {
    /// The error, with its sources.
    pub error: String,
    /// Whether the key was held by another delivery ([`idem_runtime::Error::InProgress`]).
    pub in_progress: bool,
}

impl RetryLater {
    fn database(what: &str, error: &sqlx::Error) -> Self {
        RetryLater {
            error: format!("{what}: {}", error_chain(error)),
            in_progress: false,
        }
    }
}

/// Stops a consumer the way a crash would: from the moment it is pulled, the consumer
/// commits nothing more, so the messages it processed since its last commit are
/// delivered again to the member that takes its partitions over.
#[derive(Debug, Clone)]
pub struct KillSwitch(Arc<AtomicBool>);

impl KillSwitch {
    /// Pulls the switch. Then abort (or drop) the task running [`GroupConsumer::run`].
    pub fn kill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A member of a consumer group handing every message to a [`MessageHandler`].
pub struct GroupConsumer<H> {
    consumer: StreamConsumer<GroupContext>,
    idem: Idem,
    config: ConsumerConfig,
    stats: Arc<Stats>,
    handler: H,
}

/// A member of a consumer group applying order events through `#[idempotent]` handlers.
pub type OrderConsumer = GroupConsumer<OrderEvents>;

impl<H> fmt::Debug for GroupConsumer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupConsumer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A delivery waiting to be processed, and whether an earlier round ran its handler (a
/// batch applied again from an earlier message that had to be retried).
struct Pending {
    delivery: Delivery,
    executed: bool,
}

impl OrderConsumer {
    /// A consumer of order events ([`OrderEvents`]), subscribed to the topic. Messages
    /// flow once [`GroupConsumer::run`] polls it.
    ///
    /// The business, offset and dead-letter tables must exist
    /// ([`create_tables`](super::create_tables)), as must idem's status table
    /// ([`Idem::migrate`]).
    pub fn new(
        idem: Idem,
        config: ConsumerConfig,
        stats: Arc<Stats>,
    ) -> Result<Self, ConsumerError> {
        GroupConsumer::with_handler(idem, config, stats, OrderEvents)
    }
}

impl<H: MessageHandler> GroupConsumer<H> {
    /// Creates the consumer and subscribes it to the topic. Messages flow once
    /// [`GroupConsumer::run`] polls it.
    ///
    /// The offset and dead-letter tables must exist ([`create_tables`](super::create_tables)),
    /// as must idem's status table ([`Idem::migrate`]) and what `handler` writes.
    pub fn with_handler(
        idem: Idem,
        config: ConsumerConfig,
        stats: Arc<Stats>,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        let context = GroupContext {
            group: config.group.clone(),
            offsets: config.offsets,
            progress: Mutex::default(),
            killed: Arc::new(AtomicBool::new(false)),
            database: idem.pool().connect_options().as_ref().clone(),
        };
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group)
            .set("client.id", &config.client_id)
            // Offsets are committed by this code, and only for processed messages.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set(
                "session.timeout.ms",
                config.session_timeout.as_millis().to_string(),
            )
            .set(
                "heartbeat.interval.ms",
                (config.session_timeout.as_millis() / 4).to_string(),
            );
        for (name, value) in &config.extra {
            client.set(name, value);
        }
        let consumer: StreamConsumer<GroupContext> = client.create_with_context(context)?;
        consumer.subscribe(&[&config.topic])?;
        Ok(GroupConsumer {
            consumer,
            idem,
            config,
            stats,
            handler,
        })
    }

    /// The switch that makes this consumer stop as if it had crashed.
    pub fn kill_switch(&self) -> KillSwitch {
        KillSwitch(self.consumer.context().killed.clone())
    }

    /// Consumes until `shutdown` completes, then commits what was processed and leaves the
    /// group. Bad messages and database outages do not end it.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ConsumerError> {
        let mut shutdown = pin!(shutdown);
        let mut tick = tokio::time::interval(self.config.commit_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(
            group = %self.config.group, topic = %self.config.topic, offsets = %self.config.offsets,
            batch_size = self.config.batch_size, "consumer started"
        );
        loop {
            let first = tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = tick.tick() => {
                    self.save_progress().await;
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
            let deliveries = self.fill_batch(first).await;
            self.stats
                .deliveries
                .fetch_add(deliveries.len() as u64, Ordering::Relaxed);
            if !self.process(deliveries, shutdown.as_mut()).await {
                break;
            }
        }
        self.close().await
    }

    /// Adds to `first` what arrives within the batch linger, up to the batch size.
    ///
    /// Out of the `select!` of [`run`](Self::run): a message received here must not be
    /// dropped with a cancelled future.
    async fn fill_batch(&self, first: Delivery) -> Vec<Delivery> {
        let mut deliveries = vec![first];
        let deadline = tokio::time::Instant::now() + self.config.batch_linger;
        while deliveries.len() < self.config.batch_size {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Ok(Ok(message)) => deliveries.push(Delivery::from_message(&message)),
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
        let mut pending: Vec<Pending> = deliveries
            .into_iter()
            .map(|delivery| Pending {
                delivery,
                executed: false,
            })
            .collect();
        let mut backoff = self.config.retry_backoff;
        let mut attempt = 0u32;
        loop {
            let (applied, retry) = if self.config.batch_size <= 1 && pending.len() == 1 {
                match self.apply(&pending[0].delivery).await {
                    Ok(applied) => (vec![applied], None),
                    Err(retry) => (Vec::new(), Some(retry)),
                }
            } else {
                // A retry takes the failing message on its own: if it fails again, the
                // messages behind it are not rolled back and redone one by one with it.
                let round = if attempt > 0 { 1 } else { pending.len() };
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.apply_round(&mut pending[..round]).await
            };
            let done = applied.len();
            for (item, applied) in pending.drain(..done).zip(applied) {
                let stored_in_tx = self.config.offsets == OffsetStore::Postgres
                    && self.config.batch_size <= 1
                    && match applied {
                        Applied::DeadLettered => true,
                        Applied::Executed => self.handler.stores_position(),
                        Applied::Duplicate | Applied::Skipped => false,
                    };
                self.consumer
                    .context()
                    .processed(&item.delivery.at, stored_in_tx);
                self.stats.processed(&item.delivery.at, applied);
            }
            let Some(retry) = retry else {
                if pending.is_empty() {
                    return true;
                }
                // The retried message is done: the rest of the batch, together again.
                backoff = self.config.retry_backoff;
                attempt = 0;
                continue;
            };
            if done > 0 {
                // A new message failed: its own back-off, and commit what is done.
                backoff = self.config.retry_backoff;
                attempt = 0;
                self.save_progress().await;
            }
            attempt += 1;
            self.stats.retried(&retry);
            let at = &pending[0].delivery.at;
            tracing::warn!(
                topic = %at.topic, partition = at.partition, offset = at.offset, attempt,
                waiting = pending.len(), retry_in = ?backoff, error = %retry.error,
                in_progress = retry.in_progress,
                "message not applied yet; retrying it (its offset stays uncommitted)"
            );
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = &mut shutdown => return false,
            }
            backoff = (backoff * 2).min(self.config.max_retry_backoff);
        }
    }

    /// Handles one delivery once (the per-message path): `Ok` when it is done with
    /// (applied, duplicate, skipped or dead-lettered), `Err` when it must be retried.
    pub async fn apply(&self, delivery: &Delivery) -> Result<Applied, RetryLater> {
        let message = match self.decode(delivery) {
            Ok(message) => message,
            Err(error) => {
                return self
                    .dead_letter(delivery, Reason::Undecodable, &error, true)
                    .await;
            }
        };
        let position =
            (self.config.offsets == OffsetStore::Postgres).then(|| self.position(&delivery.at));
        let verdict = self
            .handler
            .apply(&self.idem, &message, position.as_ref())
            .await;
        self.route(delivery, verdict, false).await
    }

    /// One round of the batch path over `pending`: the applied verdicts of the messages
    /// done with, in order, up to the first one to retry (and why).
    async fn apply_round(&self, pending: &mut [Pending]) -> (Vec<Applied>, Option<RetryLater>) {
        // Undecodable messages first, in their own transactions, without positions: the
        // batch transaction may then store positions past them.
        let mut decoded = Vec::with_capacity(pending.len());
        let mut slots = Vec::with_capacity(pending.len());
        for item in pending.iter() {
            match self.decode(&item.delivery) {
                Ok(message) => {
                    slots.push(Some(decoded.len()));
                    decoded.push(message);
                }
                Err(error) => {
                    if let Err(retry) = self
                        .dead_letter(&item.delivery, Reason::Undecodable, &error, false)
                        .await
                    {
                        return (Vec::new(), Some(retry));
                    }
                    slots.push(None);
                }
            }
        }
        let verdicts = if decoded.is_empty() {
            Vec::new()
        } else {
            let positions: Option<Vec<Position>> = (self.config.offsets == OffsetStore::Postgres)
                .then(|| {
                    pending
                        .iter()
                        .zip(&slots)
                        .filter(|(_, slot)| slot.is_some())
                        .map(|(item, _)| self.position(&item.delivery.at))
                        .collect()
                });
            self.handler
                .apply_batch(&self.idem, &decoded, positions.as_deref())
                .await
        };
        for (item, slot) in pending.iter_mut().zip(&slots) {
            if let Some(verdict) = slot.and_then(|index| verdicts.get(index)) {
                item.executed |= *verdict == Verdict::Executed;
            }
        }
        let mut applied = Vec::with_capacity(pending.len());
        for (item, slot) in pending.iter().zip(slots) {
            let Some(index) = slot else {
                applied.push(Applied::DeadLettered);
                continue;
            };
            let Some(verdict) = verdicts.get(index).cloned() else {
                let retry = RetryLater {
                    error: "not handled in this round".to_owned(),
                    in_progress: false,
                };
                return (applied, Some(retry));
            };
            match self.route(&item.delivery, verdict, item.executed).await {
                Ok(done) => applied.push(done),
                Err(retry) => return (applied, Some(retry)),
            }
        }
        (applied, None)
    }

    fn decode(&self, delivery: &Delivery) -> Result<H::Message, String> {
        match delivery.payload.as_deref() {
            None => Err("the message has no payload".to_owned()),
            Some(payload) => self.handler.decode(payload),
        }
    }

    /// Routes a verdict: dead letters are written (with the position, in the Postgres
    /// variant, in the same transaction), retries are returned. `executed_before`: an
    /// earlier round ran this message's handler, so a duplicate now is its own effect.
    async fn route(
        &self,
        delivery: &Delivery,
        verdict: Verdict,
        executed_before: bool,
    ) -> Result<Applied, RetryLater> {
        match verdict {
            Verdict::Executed => Ok(Applied::Executed),
            Verdict::Duplicate if executed_before => Ok(Applied::Executed),
            Verdict::Duplicate => Ok(Applied::Duplicate),
            Verdict::Skipped => Ok(Applied::Skipped),
            Verdict::DeadLetter { reason, error } => {
                self.dead_letter(delivery, reason, &error, true).await
            }
            Verdict::Retry { error, in_progress } => Err(RetryLater { error, in_progress }),
        }
    }

    /// Writes the delivery to the dead-letter table; in the Postgres variant and with
    /// `store_position`, stores the position after it in the same transaction (only when
    /// every earlier message of its partition is done).
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: Reason,
        error: &str,
        store_position: bool,
    ) -> Result<Applied, RetryLater> {
        let written = async {
            let mut tx = self.idem.pool().begin().await?;
            let new =
                dead_letter::insert(&mut tx, &self.config.group, delivery, reason, error).await?;
            if store_position && self.config.offsets == OffsetStore::Postgres {
                self.position(&delivery.at).store(&mut tx).await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(new)
        };
        match written.await {
            Ok(new) => {
                let at = &delivery.at;
                tracing::warn!(
                    topic = %at.topic, partition = at.partition, offset = at.offset,
                    reason = reason.as_str(), %error, already_recorded = !new,
                    "message dead-lettered"
                );
                Ok(Applied::DeadLettered)
            }
            Err(db) => Err(RetryLater::database(
                &format!("dead-lettering the message failed ({})", reason.as_str()),
                &db,
            )),
        }
    }

    fn position(&self, at: &Coordinates) -> Position {
        Position {
            group: self.config.group.clone(),
            topic: at.topic.clone(),
            partition: at.partition,
            next_offset: at.offset + 1,
        }
    }

    /// Stores the processed positions that are not stored yet (Postgres variant) and
    /// commits them to Kafka, without waiting for the broker.
    async fn save_progress(&self) {
        if self.store_progress().await {
            self.commit_progress(CommitMode::Async);
        }
    }

    /// Postgres variant: stores the processed positions that are not stored yet. Returns
    /// whether the positions may be committed to Kafka (never ahead of PostgreSQL).
    async fn store_progress(&self) -> bool {
        let context = self.consumer.context();
        if context.killed() {
            return false;
        }
        if self.config.offsets == OffsetStore::Postgres {
            let pending = context.unstored();
            if !pending.is_empty() {
                let stored = async {
                    let mut conn = self.idem.pool().acquire().await?;
                    offsets::store_all(&mut conn, &self.config.group, &pending).await
                };
                if let Err(error) = stored.await {
                    tracing::warn!(%error, "storing offsets in postgres failed; retrying at the next commit");
                    context.unstore(&pending);
                    return false;
                }
            }
        }
        true
    }

    /// Commits the processed positions not committed yet to Kafka.
    fn commit_progress(&self, mode: CommitMode) {
        commit(&self.consumer, mode);
    }

    /// Saves the progress (synchronously) and leaves the group.
    async fn close(self) -> Result<(), ConsumerError> {
        let commit_too = self.store_progress().await;
        let GroupConsumer {
            consumer, config, ..
        } = self;
        // Committing synchronously and leaving the group block: not on the runtime's threads.
        tokio::task::spawn_blocking(move || {
            if commit_too {
                commit(&consumer, CommitMode::Sync);
            }
            drop(consumer);
            tracing::info!(group = %config.group, "consumer stopped");
        })
        .await?;
        Ok(())
    }
}

/// The rdkafka context: rebalance handling and the processed offsets.
struct GroupContext {
    group: String,
    offsets: OffsetStore,
    progress: Mutex<HashMap<(String, i32), PartitionProgress>>,
    killed: Arc<AtomicBool>,
    database: PgConnectOptions,
}

/// What is known of one partition: processed up to `next`, committed to Kafka up to
/// `committed`, stored in PostgreSQL up to `stored` (`-1`: nothing yet).
#[derive(Debug, Clone, Copy)]
struct PartitionProgress {
    next: i64,
    committed: i64,
    stored: i64,
}

impl GroupContext {
    fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    fn processed(&self, at: &Coordinates, stored: bool) {
        let mut progress = lock(&self.progress);
        let entry = progress
            .entry((at.topic.clone(), at.partition))
            .or_insert(PartitionProgress {
                next: -1,
                committed: -1,
                stored: -1,
            });
        entry.next = entry.next.max(at.offset + 1);
        if stored {
            entry.stored = entry.stored.max(at.offset + 1);
        }
    }

    /// The processed positions not committed to Kafka yet; marks them committed.
    fn uncommitted(&self) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for ((topic, partition), entry) in lock(&self.progress).iter_mut() {
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
    fn uncommit(&self, list: &TopicPartitionList) {
        let mut progress = lock(&self.progress);
        for element in list.elements() {
            if let Some(entry) =
                progress.get_mut(&(element.topic().to_owned(), element.partition()))
            {
                entry.committed = -1;
            }
        }
    }

    /// The processed positions not stored in PostgreSQL yet; marks them stored.
    fn unstored(&self) -> Vec<(String, i32, i64)> {
        let mut pending = Vec::new();
        for ((topic, partition), entry) in lock(&self.progress).iter_mut() {
            if entry.next > entry.stored {
                pending.push((topic.clone(), *partition, entry.next));
                entry.stored = entry.next;
            }
        }
        pending
    }

    fn unstore(&self, pending: &[(String, i32, i64)]) {
        let mut progress = lock(&self.progress);
        for (topic, partition, _) in pending {
            if let Some(entry) = progress.get_mut(&(topic.clone(), *partition)) {
                entry.stored = -1;
            }
        }
    }

    /// Postgres variant, on assignment: start each partition at its stored offset.
    ///
    /// If the offsets cannot be read, the partitions start at Kafka's committed offsets,
    /// which are never ahead of the stored ones: more duplicates, nothing skipped.
    fn start_at_stored_offsets(&self, assignment: &mut TopicPartitionList) {
        let partitions: Vec<(String, i32)> = assignment
            .elements()
            .iter()
            .map(|element| (element.topic().to_owned(), element.partition()))
            .collect();
        let mut topics: Vec<&str> = partitions.iter().map(|(topic, _)| topic.as_str()).collect();
        topics.sort_unstable();
        topics.dedup();
        for topic in topics {
            match self.on_side_thread(async |conn| offsets::load(conn, &self.group, topic).await) {
                Ok(stored) => {
                    for (_, partition) in partitions.iter().filter(|(t, _)| t == topic) {
                        if let Some(&next) = stored.get(partition) {
                            assignment
                                .set_partition_offset(topic, *partition, Offset::Offset(next))
                                .ok();
                            tracing::debug!(
                                topic,
                                partition,
                                next,
                                "starting at the offset stored in postgres"
                            );
                        }
                    }
                }
                Err(error) => tracing::warn!(
                    topic, %error,
                    "cannot read the stored offsets; starting at kafka's committed offsets (duplicates, nothing skipped)"
                ),
            }
        }
    }

    /// On revocation: store and commit what was processed in the revoked partitions,
    /// then forget them.
    fn save_revoked(&self, base: &BaseConsumer<Self>, revoked: &TopicPartitionList) {
        let keys: Vec<(String, i32)> = revoked
            .elements()
            .iter()
            .map(|element| (element.topic().to_owned(), element.partition()))
            .collect();
        let entries: Vec<((String, i32), PartitionProgress)> = {
            let mut progress = lock(&self.progress);
            keys.iter()
                .filter_map(|key| progress.remove(key).map(|entry| (key.clone(), entry)))
                .collect()
        };
        if self.killed() {
            return;
        }
        if self.offsets == OffsetStore::Postgres {
            let pending: Vec<(String, i32, i64)> = entries
                .iter()
                .filter(|(_, entry)| entry.next > entry.stored)
                .map(|((topic, partition), entry)| (topic.clone(), *partition, entry.next))
                .collect();
            if !pending.is_empty() {
                let store = async |conn: &mut PgConnection| {
                    offsets::store_all(conn, &self.group, &pending).await
                };
                if let Err(error) = self.on_side_thread(store) {
                    tracing::warn!(%error, "storing the revoked partitions' offsets failed; they will be read again (duplicates)");
                }
            }
        }
        let mut list = TopicPartitionList::new();
        for ((topic, partition), entry) in &entries {
            if entry.next > entry.committed {
                list.add_partition_offset(topic, *partition, Offset::Offset(entry.next))
                    .ok();
            }
        }
        if list.count() > 0
            && let Err(error) = base.commit(&list, CommitMode::Sync)
        {
            tracing::warn!(%error, "committing the revoked partitions' offsets failed; they will be read again (duplicates)");
        }
    }

    /// Runs a short database job from inside an rdkafka callback, which is synchronous:
    /// on a thread of its own with its own connection, so that it never waits for the
    /// async runtime that is blocked in the callback.
    fn on_side_thread<T: Send>(
        &self,
        job: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error> + Send,
    ) -> Result<T, sqlx::Error> {
        let options = &self.database;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(sqlx::Error::Io)?;
                    runtime.block_on(async move {
                        let work = async {
                            let mut conn = PgConnection::connect_with(options).await?;
                            let result = job(&mut conn).await;
                            conn.close().await.ok();
                            result
                        };
                        tokio::time::timeout(Duration::from_secs(10), work)
                            .await
                            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
                    })
                })
                .join()
                .unwrap_or_else(|_| Err(sqlx::Error::WorkerCrashed))
        })
    }
}

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as Level;
        match level {
            Level::Emerg | Level::Alert | Level::Critical | Level::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            Level::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            Level::Notice | Level::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            Level::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        base: &BaseConsumer<Self>,
        event: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let described = describe(partitions);
        match event {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                if self.offsets == OffsetStore::Postgres {
                    self.start_at_stored_offsets(partitions);
                }
                let assigned = if cooperative {
                    base.incremental_assign(partitions)
                } else {
                    base.assign(partitions)
                };
                log_rebalance("assigned", &described, assigned);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.save_revoked(base, partitions);
                let unassigned = if cooperative {
                    base.incremental_unassign(partitions)
                } else {
                    base.unassign()
                };
                log_rebalance("revoked", &described, unassigned);
            }
            other => {
                tracing::error!(error = ?other, "rebalance failed; dropping the assignment");
                lock(&self.progress).clear();
                base.unassign().ok();
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            tracing::debug!(%error, "an offset commit failed; retrying at the next commit");
            self.uncommit(offsets);
        }
    }
}

/// Commits the processed positions not committed yet (unless the consumer was killed).
fn commit(consumer: &StreamConsumer<GroupContext>, mode: CommitMode) {
    let context = consumer.context();
    if context.killed() {
        return;
    }
    let to_commit = context.uncommitted();
    if to_commit.count() > 0
        && let Err(error) = consumer.commit(&to_commit, mode)
    {
        tracing::warn!(%error, "committing offsets to kafka failed; retrying at the next commit");
        context.uncommit(&to_commit);
    }
}

fn describe(partitions: &TopicPartitionList) -> String {
    let mut by_topic: Vec<(String, i32)> = partitions
        .elements()
        .iter()
        .map(|element| (element.topic().to_owned(), element.partition()))
        .collect();
    by_topic.sort();
    by_topic
        .iter()
        .map(|(topic, partition)| format!("{topic}/{partition}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_rebalance(what: &str, partitions: &str, result: KafkaResult<()>) {
    match result {
        Ok(()) => tracing::info!(partitions, "partitions {what}"),
        Err(error) => tracing::warn!(partitions, %error, "partitions {what}, with an error"),
    }
}

/// The error and its sources, `: `-separated; a source whose text the message already
/// shows is not repeated.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(error) = source {
        let more = error.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = error.source();
    }
    text
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
