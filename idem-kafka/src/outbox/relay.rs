//! The relay: publishes the outbox's committed records to Kafka, in order per shard, and
//! marks them sent once the broker acknowledged them.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_runtime::{Idem, storable_text_of};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use sqlx::postgres::PgListener;
use uuid::Uuid;

use super::{KEY_HEADER, SHARDS};
use crate::error::ConsumerError;
use crate::schema::Schema;
use crate::store::outbox::{self as store, Pending};

/// Publishes the outbox of a handle: run one in every consumer process.
///
/// Each shard of the outbox is published by one relay at a time, which holds it with a
/// lease on the database clock (renewed every third of [`lease`](RelayBuilder::lease));
/// a relay that dies leaves its shards to the others once the lease ran out. Relays do
/// not share the load: the first to start takes every free shard, and the others stand
/// by until a lease runs out (or its relay stops and gives its shards up). Within a
/// shard, records go out in their order, through an idempotent producer
/// (`enable.idempotence`, which keeps the order of a partition through retries), and are
/// marked sent only after the broker acknowledged them. A relay killed between the two
/// publishes those records again: a duplicate with the same [`KEY_HEADER`], which the
/// consumer's `#[idempotent]` handler answers as one.
///
/// A record the broker refuses for good (a topic that does not exist, a record too
/// large) or that failed [`max_attempts`](RelayBuilder::max_attempts) times is parked
/// with its error: it is never retried by itself and never holds up another key (`idem
/// outbox retry` puts it back). A failure that is the broker's (out of reach, too slow,
/// the producer's queue full) counts no attempt: the relay tries again after a pause that
/// doubles up to 5 s, without letting later records of the key overtake. Each shard's
/// acknowledgements are awaited on their own, and the leases are renewed while a round
/// waits for the broker. The relay wakes on `LISTEN` when a handler sent a record
/// (behind a transaction pooler, where `LISTEN` is not available, it polls), and every
/// [`poll`](RelayBuilder::poll) anyway. Sent records are kept for
/// [`retention`](RelayBuilder::retention), then deleted by the relay holding shard 0.
///
/// ```no_run
/// # async fn run(idem: idem_runtime::Idem) -> Result<(), idem_kafka::ConsumerError> {
/// let relay = idem_kafka::outbox::Relay::builder("127.0.0.1:9092").build(&idem)?;
/// relay.run(idem_kafka::shutdown_signal()).await?;
/// # Ok(()) }
/// ```
pub struct Relay {
    idem: Idem,
    schema: Schema,
    /// The database's name, a label of the relay's metrics beside the schema's.
    database: String,
    producer: FutureProducer,
    owner: Uuid,
    settings: RelayBuilder,
    stats: Arc<RelayStats>,
    /// What the broker said of topics lately: whether each is missing (`None`: no answer),
    /// and when it said so.
    topics: std::sync::Mutex<std::collections::HashMap<String, (Instant, Option<bool>)>>,
    /// Tests only (`test-util`): stop as a crash would, after the broker acknowledged a
    /// round's records and before they are marked sent.
    killed: Arc<AtomicBool>,
    died: AtomicBool,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("schema", &self.schema)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// The settings of a [`Relay`].
#[derive(Debug, Clone)]
pub struct RelayBuilder {
    brokers: String,
    schema: Option<Schema>,
    lease: Duration,
    poll: Duration,
    batch: usize,
    max_attempts: u32,
    retention: Duration,
    extra: Vec<(String, String)>,
}

/// What a relay did so far.
#[derive(Debug, Default)]
pub struct RelayStats {
    published: AtomicU64,
    failed: AtomicU64,
    parked: AtomicU64,
    purged: AtomicU64,
}

impl RelayStats {
    /// Records the broker acknowledged and the relay marked sent.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Publications that failed (the record is tried again, or parked).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Records set aside for good.
    pub fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }

    /// Sent records deleted after the retention window.
    pub fn purged(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }
}

impl RelayBuilder {
    /// The schema of the outbox (default: the adapter's for the handle, `<idem's
    /// schema>_kafka`).
    pub fn schema(mut self, schema: Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    /// How long a shard stays with a relay that stopped renewing (default 15 s): the
    /// longest a dead relay's shards wait.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// How often the relay looks for records without being woken (default 1 s).
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(10));
        self
    }

    /// Records published per shard in one round (default 500).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.clamp(1, 100_000);
        self
    }

    /// Failed publications after which a record is parked (default 10).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// How long sent records are kept (default 7 days).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// A librdkafka producer setting (`linger.ms`, `security.protocol`, ...). The relay's
    /// own (`enable.idempotence`, `acks`) cannot be turned off.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.push((name.into(), value.into()));
        self
    }

    /// The relay of `idem`'s outbox.
    pub fn build(self, idem: &Idem) -> Result<Relay, ConsumerError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000");
        for (name, value) in &self.extra {
            config.set(name, value);
        }
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("max.in.flight.requests.per.connection", "5");
        let producer: FutureProducer = config.create()?;
        let schema = match &self.schema {
            Some(schema) => schema.clone().behind(idem),
            None => Schema::for_idem(idem).checked()?,
        };
        let database = idem
            .pool()
            .connect_options()
            .get_database()
            .unwrap_or_default()
            .to_owned();
        Ok(Relay {
            idem: idem.clone(),
            schema,
            database,
            producer,
            owner: Uuid::new_v4(),
            settings: self,
            stats: Arc::default(),
            topics: std::sync::Mutex::default(),
            killed: Arc::default(),
            died: AtomicBool::new(false),
        })
    }
}

/// The channel a relay listens on for `schema`'s outbox.
pub(crate) fn channel(schema: &Schema) -> String {
    format!("{}_outbox", schema.as_str())
}

/// What one round over the held shards did.
struct Round {
    /// Some shard had a full batch: go on without waiting.
    more: bool,
    /// The broker did not take some records for reasons that are not theirs (it was
    /// unreachable, slow, or the producer's queue was full): wait before the next round.
    unavailable: bool,
}

impl Relay {
    /// A relay publishing to `brokers`.
    pub fn builder(brokers: impl Into<String>) -> RelayBuilder {
        RelayBuilder {
            brokers: brokers.into(),
            schema: None,
            lease: Duration::from_secs(15),
            poll: Duration::from_secs(1),
            batch: 500,
            max_attempts: 10,
            retention: Duration::from_secs(7 * 24 * 3600),
            extra: Vec::new(),
        }
    }

    /// What the relay did so far.
    pub fn stats(&self) -> &RelayStats {
        &self.stats
    }

    /// A switch that stops the relay the way a crash would, at the first round that
    /// publishes something once it is pulled: after the broker acknowledged the round's
    /// records, before they are marked sent, and without giving its shards up.
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn kill_switch(&self) -> crate::test_util::KillSwitch {
        crate::test_util::KillSwitch::new(self.killed.clone())
    }

    fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// This relay's id in `kafka_outbox_relays` (and `idem outbox`).
    pub fn id(&self) -> Uuid {
        self.owner
    }

    /// Publishes until `shutdown` completes, then finishes the round in flight and gives
    /// its shards up. Database and broker outages are waited out; an outbox whose tables
    /// do not exist (`idem_kafka::migrate` has not run) ends it with the error.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<(), ConsumerError> {
        tokio::pin!(shutdown);
        let mut listener = self.listen().await;
        let mut held: Vec<i16> = Vec::new();
        let renewed = std::sync::Mutex::new(Instant::now() - self.settings.lease);
        let renewed_at = || {
            *renewed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let mut purged = Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.died.load(Ordering::SeqCst) {
                return Ok(());
            }
            let step = async {
                if renewed_at().elapsed() >= self.settings.lease / 3 {
                    held = self.hold().await?;
                    *renewed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
                }
                // The leases are renewed while the round waits for the broker, however
                // long that takes: another relay takes a shard over only from a relay
                // that stopped.
                let keep = async {
                    loop {
                        tokio::time::sleep(self.settings.lease / 3).await;
                        if self.hold().await.is_ok() {
                            *renewed
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Instant::now();
                        }
                    }
                };
                let round = tokio::select! {
                    round = self.round(&held, renewed_at()) => round?,
                    never = keep => never,
                };
                if held.contains(&0) && purged.elapsed() >= Duration::from_secs(60) {
                    self.purge().await?;
                    purged = Instant::now();
                }
                Ok::<_, sqlx::Error>(round)
            };
            let wait = match step.await {
                Ok(round) if round.unavailable => {
                    // The broker did not take records, for reasons that are not theirs:
                    // tried again, later and later, without counting an attempt.
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    backoff
                }
                Ok(round) if round.more => Duration::ZERO,
                Ok(_) => {
                    backoff = Duration::from_millis(50);
                    self.settings.poll.min(self.settings.lease / 3)
                }
                Err(error) if missing_outbox(&error) => {
                    tracing::error!(%error, "the outbox's tables are missing: run the consumers' migrate (idem_kafka::migrate) first");
                    return Err(ConsumerError::Database(error));
                }
                Err(error) => {
                    tracing::warn!(%error, "the outbox relay could not reach the database; trying again");
                    metrics::counter!("idem_outbox_relay_errors_total", "kind" => "database")
                        .increment(1);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    backoff
                }
            };
            let woken = async {
                match listener.as_mut() {
                    Some(listener) if !wait.is_zero() => {
                        if listener.recv().await.is_err() {
                            tokio::time::sleep(wait).await;
                        }
                    }
                    _ => std::future::pending::<()>().await,
                }
            };
            // The shutdown first: a backlog that fills every round never holds it up.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = tokio::time::sleep(wait) => {}
                () = woken => {}
            }
        }
        self.alone(async |conn, schema| store::release_shards(conn, schema, self.owner).await)
            .await?;
        Ok(())
    }

    /// One round without waiting: takes the free shards, publishes what is waiting in the
    /// held ones (a batch each), and returns how many records it marked sent.
    pub async fn run_once(&self) -> Result<u64, ConsumerError> {
        let before = self.stats.published();
        let held = self.hold().await?;
        self.round(&held, Instant::now()).await?;
        Ok(self.stats.published() - before)
    }

    /// Deletes sent records older than the retention window; returns how many.
    pub async fn purge(&self) -> Result<u64, sqlx::Error> {
        let retention = self.settings.retention;
        let deleted = self
            .alone(async |conn, schema| store::purge_sent(conn, schema, retention, 1000).await)
            .await?;
        self.stats.purged.fetch_add(deleted, Ordering::Relaxed);
        metrics::counter!("idem_outbox_purged_total").increment(deleted);
        Ok(deleted)
    }

    async fn listen(&self) -> Option<PgListener> {
        if !self.schema.prepared() {
            return None; // a transaction pooler: no session to listen on
        }
        let mut listener = PgListener::connect_with(self.idem.pool()).await.ok()?;
        listener.listen(&channel(&self.schema)).await.ok()?;
        Some(listener)
    }

    /// Runs `job` on a connection of the pool, in a transaction of its own behind a
    /// transaction pooler.
    async fn alone<T>(
        &self,
        job: impl AsyncFnOnce(&mut sqlx::PgConnection, &Schema) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        let mut conn = self.idem.pool().acquire().await?;
        let schema = &self.schema;
        crate::store::alone(&mut conn, schema, async |conn| job(conn, schema).await).await
    }

    async fn hold(&self) -> Result<Vec<i16>, sqlx::Error> {
        let (owner, lease) = (self.owner, self.settings.lease);
        self.alone(async |conn, schema| {
            store::hold_shards(conn, schema, owner, lease, SHARDS, SHARDS).await
        })
        .await
    }

    /// One round over the held shards: what waits in each (a batch per shard, one
    /// query), handed to the producer shard by shard, each shard's acknowledgements
    /// awaited in order and marked as soon as they are in, whatever the other shards'.
    async fn round(&self, held: &[i16], renewed: Instant) -> Result<Round, sqlx::Error> {
        // A lease about to run out may already be another relay's: publish nothing from
        // it until it is renewed.
        if renewed.elapsed() >= self.settings.lease / 2 {
            return Ok(Round {
                more: true,
                unavailable: false,
            });
        }
        if held.is_empty() {
            return Ok(Round {
                more: false,
                unavailable: false,
            });
        }
        let limit = self.settings.batch as i64;
        let mut pending = self
            .alone(async |conn, schema| store::pending(conn, schema, held, limit).await)
            .await?;
        let more = pending
            .iter()
            .any(|(_, records)| records.len() == self.settings.batch);
        self.park_missing_topics(&mut pending).await?;
        let settled = futures_util::future::join_all(
            pending
                .into_iter()
                .map(|(shard, records)| self.settle(shard, self.produce(records))),
        )
        .await;
        let mut unavailable = false;
        for shard in settled {
            unavailable |= shard?;
        }
        if self.died.load(Ordering::SeqCst) {
            return Ok(Round {
                more: false,
                unavailable,
            });
        }
        if !more {
            let oldest = self
                .alone(async |conn, schema| store::oldest_unsent(conn, schema).await)
                .await?;
            metrics::gauge!(
                "idem_outbox_oldest_unsent_seconds",
                "schema" => self.schema.as_str().to_owned(),
                "database" => self.database.clone()
            )
            .set(oldest.map_or(0.0, |age| age.as_secs_f64()));
        }
        Ok(Round { more, unavailable })
    }

    /// Parks, before anything is produced, the records of topics that the broker says do
    /// not exist (and takes them out of `pending`): handed to the producer, such a record
    /// would wait for the topic until `message.timeout.ms`, and the round, every shard's
    /// records with it, would wait that long. A broker that creates topics on demand
    /// answers with the topic.
    async fn park_missing_topics(
        &self,
        pending: &mut [(i16, Vec<Pending>)],
    ) -> Result<(), sqlx::Error> {
        let mut missing = Vec::new();
        for (_, records) in pending.iter_mut() {
            let mut kept = Vec::with_capacity(records.len());
            for record in std::mem::take(records) {
                if self.topic_unknown(&record.topic).await {
                    missing.push((record.id, missing_topic(&record.topic, "")));
                } else {
                    kept.push(record);
                }
            }
            *records = kept;
        }
        if missing.is_empty() {
            return Ok(());
        }
        for (id, _) in &missing {
            tracing::warn!(
                id,
                "an outbox record's topic does not exist; the record is parked"
            );
        }
        let count = missing.len() as u64;
        self.alone(async |conn, schema| {
            for (id, text) in &missing {
                store::record_failure(conn, schema, *id, text, true).await?;
            }
            Ok(())
        })
        .await?;
        self.stats.failed.fetch_add(count, Ordering::Relaxed);
        self.stats.parked.fetch_add(count, Ordering::Relaxed);
        metrics::counter!("idem_outbox_relay_errors_total", "kind" => "publish").increment(count);
        metrics::counter!("idem_outbox_parked_total").increment(count);
        Ok(())
    }

    /// Hands one shard's records (in order) to the producer; stops at the first that its
    /// queue does not take (full), leaving it and the rest of the shard for a later round.
    fn produce(&self, pending: Vec<Pending>) -> Produced {
        let mut deliveries = Vec::with_capacity(pending.len());
        let mut queue_full = false;
        for record in &pending {
            if queue_full {
                break;
            }
            let key_text = record.idem_key.to_string();
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 1);
            for (name, value) in &record.headers {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            headers = headers.insert(Header {
                key: KEY_HEADER,
                value: Some(&key_text),
            });
            let mut future = FutureRecord::to(&record.topic).headers(headers);
            if let Some(key) = &record.key {
                future = future.key(key);
            }
            if let Some(payload) = &record.payload {
                future = future.payload(payload);
            }
            if let Some(partition) = record.partition {
                future = future.partition(partition);
            }
            deliveries.push(match self.producer.send_result(future) {
                Ok(delivery) => Ok(delivery),
                Err((error, _)) => {
                    queue_full = matches!(
                        error,
                        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
                    );
                    Err(error)
                }
            });
        }
        Produced {
            pending,
            deliveries,
        }
    }

    /// Awaits one shard's acknowledgements, in order, and marks what the broker took;
    /// records the failures that count against their record, parking what can never go.
    /// Returns whether the broker failed records for reasons that are not theirs.
    async fn settle(&self, shard: i16, produced: Produced) -> Result<bool, sqlx::Error> {
        let Produced {
            pending,
            deliveries,
        } = produced;
        let mut sent = Vec::new();
        // After a failure that is tried again, the later records of the same topic and
        // key wait too, so that they never overtake it.
        let mut held_back: HashSet<(&str, Option<&[u8]>)> = HashSet::new();
        let mut failures = Vec::new();
        let mut unavailable = false;
        for (record, delivery) in pending.iter().zip(deliveries) {
            let result = match delivery {
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((error, _))) => Err(error),
                    Err(_) => Err(KafkaError::Canceled),
                },
                Err(error) => Err(error),
            };
            let order = (record.topic.as_str(), record.key.as_deref());
            let error = match result {
                Ok(()) if !held_back.contains(&order) => {
                    sent.push(record.id);
                    continue;
                }
                Ok(()) => continue,
                Err(error) => error,
            };
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("idem_outbox_relay_errors_total", "kind" => "publish").increment(1);
            let last_try = record.attempts + 1
                >= i32::try_from(self.settings.max_attempts).unwrap_or(i32::MAX);
            let (fate, text) = match self.failure_of(&error, &record.topic).await {
                Failure::Broker => {
                    tracing::debug!(id = record.id, topic = %record.topic, %error, "the broker did not take an outbox record; trying again");
                    unavailable = true;
                    held_back.insert(order);
                    continue;
                }
                Failure::Record(for_good) => (for_good || last_try, error.to_string()),
                Failure::MissingTopic => {
                    (true, missing_topic(&record.topic, &format!(" ({error})")))
                }
            };
            let text = storable_text_of(&text, 2000);
            tracing::warn!(id = record.id, topic = %record.topic, %error, park = fate, "an outbox record was not published");
            failures.push((record.id, text, fate));
            if fate {
                self.stats.parked.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("idem_outbox_parked_total").increment(1);
            } else {
                held_back.insert(order);
            }
        }
        if self.killed() {
            self.died.store(true, Ordering::SeqCst);
            return Ok(unavailable);
        }
        if sent.is_empty() && failures.is_empty() {
            return Ok(unavailable);
        }
        let owner = self.owner;
        let marked = self
            .alone(async |conn, schema| {
                for (id, text, park) in &failures {
                    store::record_failure(conn, schema, *id, text, *park).await?;
                }
                store::mark_sent(conn, schema, owner, shard, &sent).await
            })
            .await?;
        self.stats.published.fetch_add(marked, Ordering::Relaxed);
        metrics::counter!("idem_outbox_published_total").increment(marked);
        Ok(unavailable)
    }

    /// Whose failure `error` is: the broker's (unreachable, slow, its queue full; the
    /// record is tried again without counting an attempt), or the record's (`true`: the
    /// broker refuses it whatever the number of tries). A record that timed out to a topic
    /// that the broker says does not exist is the record's, for good.
    async fn failure_of(&self, error: &KafkaError, topic: &str) -> Failure {
        let code = match error {
            KafkaError::MessageProduction(code) => *code,
            KafkaError::Canceled => return Failure::Broker,
            _ => return Failure::Record(false),
        };
        if refused_for_good(code) {
            return Failure::Record(true);
        }
        if code == RDKafkaErrorCode::MessageTimedOut && self.topic_unknown(topic).await {
            return Failure::MissingTopic;
        }
        if the_brokers(code) {
            Failure::Broker
        } else {
            Failure::Record(false)
        }
    }

    /// Whether the broker answers that `topic` does not exist (a broker out of reach
    /// answers nothing: `false`). That it exists stands for a minute, no answer for ten
    /// seconds, that it does not for a second (a topic created meanwhile takes its
    /// records at once).
    async fn topic_unknown(&self, topic: &str) -> bool {
        let lock = || {
            self.topics
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some((at, unknown)) = lock().get(topic) {
            let stands = match unknown {
                Some(true) => Duration::from_secs(1),
                Some(false) => Duration::from_secs(60),
                None => Duration::from_secs(10),
            };
            if at.elapsed() < stands {
                return unknown.unwrap_or(false);
            }
        }
        let producer = self.producer.clone();
        let name = topic.to_owned();
        let answer = tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&name), Duration::from_secs(2))
                .ok()?;
            metadata
                .topics()
                .iter()
                .find(|known| known.name() == name)
                .map(|known| {
                    known.error().is_some_and(|error| {
                        RDKafkaErrorCode::from(error) == RDKafkaErrorCode::UnknownTopicOrPartition
                    })
                })
        })
        .await
        .ok()
        .flatten();
        // No answer (the broker is out of reach) stands as "not known to be missing".
        lock().insert(topic.to_owned(), (Instant::now(), answer));
        answer.unwrap_or(false)
    }
}

/// The error stored with a record parked because its topic does not exist.
fn missing_topic(topic: &str, detail: &str) -> String {
    format!("the topic {topic:?} does not exist, the broker says{detail}")
}

/// Whose failure a publication's error is (see [`Relay::failure_of`]).
enum Failure {
    /// The broker's: tried again, no attempt counted.
    Broker,
    /// The record's: an attempt; `true` when the broker refuses it for good.
    Record(bool),
    /// The record's topic does not exist, the broker says: refused for good.
    MissingTopic,
}

/// One shard's records handed to the producer, with their acknowledgements to come.
struct Produced {
    pending: Vec<Pending>,
    deliveries: Vec<Result<rdkafka::producer::DeliveryFuture, KafkaError>>,
}

/// Whether `error` says that the outbox's tables (or their schema) do not exist.
fn missing_outbox(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("42P01" | "3F000")))
}

/// Whether the broker refuses a record with `code` whatever the number of tries.
fn refused_for_good(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownPartition
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::InvalidMessage
    )
}

/// Whether `code` says that the broker could not take a record at that moment, whatever
/// the record: a timeout, a full queue, a broker or a leader out of reach.
fn the_brokers(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::QueueFull
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::BrokerNotAvailable
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::NotEnoughReplicas
            | RDKafkaErrorCode::NotEnoughReplicasAfterAppend
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::TimedOutQueue
            | RDKafkaErrorCode::Resolve
            | RDKafkaErrorCode::ISRInsufficient
            | RDKafkaErrorCode::PurgeQueue
            | RDKafkaErrorCode::PurgeInflight
            | RDKafkaErrorCode::KafkaStorageError
            | RDKafkaErrorCode::ThrottlingQuotaExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_default_schema_of_a_long_idem_schema_is_refused_by_name() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://localhost/none")
            .unwrap();
        let idem = Idem::builder(pool).schema("s".repeat(43)).build().unwrap();
        let Err(refused) = Relay::builder("127.0.0.1:9").build(&idem) else {
            panic!("the relay's builder took a schema name of 49 characters");
        };
        assert!(refused.to_string().contains("Schema::named"), "{refused}");
    }
}
