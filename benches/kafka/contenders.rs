//! The consumers side by side, each run in a child process of the bench: the loop a user
//! writes with rdkafka and sqlx alone, and idem-kafka with `#[idempotent]` handlers.
//!
//! Both give every fact one effect: per message (or batch), one transaction claims the key
//! with `INSERT ... ON CONFLICT DO NOTHING`, writes the business row of a new key, stores
//! the partition's position (offsets in PostgreSQL) and commits; with offsets in Kafka the
//! position is stored in the client after the commit and committed every second.
//!
//! A child prints `first <facts>` once the first fact is applied (with the facts applied
//! by then) and `done` once every partition is consumed to its end, then waits for a line
//! on its standard input before it leaves, so that the bench reads what its connections
//! cost PostgreSQL while they are open.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_demo::kafka::handlers::event_type_name;
use idem_demo::orders::OrderEvent;
use idem_kafka::{BatchPositions, Consumer, Fate, Handler, OffsetStore, Position};
use idem_runtime::{Idem, idempotent};
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::message::Message as _;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use crate::BoxError;

/// The business table and the hand-written consumer's tables (idem's and idem-kafka's
/// come from their migrations).
pub const CREATE_TABLES: &str = "
    CREATE TABLE order_effects (
        id bigserial PRIMARY KEY,
        order_id text NOT NULL,
        event_type text NOT NULL,
        amount_cents bigint NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE processed_keys (
        key uuid PRIMARY KEY,
        processed_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE consumer_offsets (
        consumer_group text NOT NULL,
        topic text NOT NULL,
        partition integer NOT NULL,
        next_offset bigint NOT NULL,
        PRIMARY KEY (consumer_group, topic, partition));";

/// Who consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Side {
    /// rdkafka and sqlx alone.
    Hand,
    /// idem-kafka and `#[idempotent]`.
    Idem,
}

/// One contender: who consumes, where the offsets go, messages per transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Contender {
    pub side: Side,
    pub offsets_in_postgres: bool,
    pub batch: usize,
}

impl Contender {
    pub fn name(&self) -> String {
        format!(
            "{}-{}-{}",
            match self.side {
                Side::Hand => "hand",
                Side::Idem => "idem",
            },
            if self.offsets_in_postgres {
                "pg"
            } else {
                "kafka"
            },
            self.batch
        )
    }

    /// The hand-written contender with the same offsets and batch.
    pub fn baseline(&self) -> Contender {
        Contender {
            side: Side::Hand,
            ..*self
        }
    }
}

/// What a child process is to do (passed as JSON in the environment).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    pub contender: Contender,
    pub brokers: String,
    pub topic: String,
    pub group: String,
    /// The bench database, through the bench's proxy.
    pub database_url: String,
    /// Per partition, the offset after its last record.
    pub end_offsets: HashMap<i32, i64>,
    /// The hand-written consumer works each partition in a task of its own.
    pub lanes: bool,
}

/// How long a batch waits for more messages after its first one: idem-kafka's default.
const BATCH_LINGER: Duration = Duration::from_millis(20);

/// The child's main: consumes the topic to its end with the contender, reporting on
/// stdout.
pub fn child_main(spec: ChildSpec) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // The pool of the example a user copies (examples/order_consumer.rs).
        let pool = PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(5))
            .connect(&spec.database_url)
            .await?;
        match spec.contender.side {
            Side::Hand => hand::run(&spec, pool).await,
            Side::Idem => by_idem::run(&spec, pool).await,
        }
    })?;
    // The bench reads the backends' CPU, then lets the child go.
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).ok();
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").ok();
    out.flush().ok();
}

/// Whether `positions` (partition -> next offset) reached every end offset.
fn reached(positions: &HashMap<i32, i64>, end_offsets: &HashMap<i32, i64>) -> bool {
    end_offsets
        .iter()
        .all(|(partition, &end)| end <= 0 || positions.get(partition).is_some_and(|&n| n >= end))
}

fn decode(payload: Option<&[u8]>) -> Result<OrderEvent, BoxError> {
    Ok(serde_json::from_slice(
        payload.ok_or("a record without payload")?,
    )?)
}

/// The consumer a user writes with rdkafka and sqlx alone.
mod hand {
    use super::*;

    /// Reads the stored offsets of the assigned partitions, when they are in PostgreSQL.
    pub struct HandContext {
        offsets_in_postgres: bool,
        database: PgConnectOptions,
        group: String,
    }

    impl ClientContext for HandContext {}

    impl ConsumerContext for HandContext {
        fn rebalance(
            &self,
            base: &BaseConsumer<Self>,
            event: RDKafkaRespErr,
            partitions: &mut TopicPartitionList,
        ) {
            match event {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                    if self.offsets_in_postgres {
                        self.start_at_stored_offsets(partitions);
                    }
                    base.assign(partitions).expect("assign");
                }
                _ => base.unassign().expect("unassign"),
            }
        }
    }

    impl HandContext {
        /// The callback is synchronous: the offsets are read on a thread of its own.
        fn start_at_stored_offsets(&self, partitions: &mut TopicPartitionList) {
            let Some(topic) = partitions
                .elements()
                .first()
                .map(|element| element.topic().to_owned())
            else {
                return;
            };
            let (options, group) = (self.database.clone(), self.group.clone());
            let read = std::thread::spawn({
                let topic = topic.clone();
                move || -> Result<Vec<(i32, i64)>, sqlx::Error> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async {
                        let mut conn = PgConnection::connect_with(&options).await?;
                        let stored = sqlx::query_as(
                            "SELECT partition, next_offset FROM consumer_offsets
                             WHERE consumer_group = $1 AND topic = $2",
                        )
                        .bind(&group)
                        .bind(&topic)
                        .fetch_all(&mut conn)
                        .await;
                        conn.close().await.ok();
                        stored
                    })
                }
            });
            let stored = read
                .join()
                .expect("the offsets' thread")
                .expect("the stored offsets");
            for (partition, next) in stored {
                partitions
                    .set_partition_offset(&topic, partition, Offset::Offset(next))
                    .ok();
            }
        }
    }

    /// One decoded record.
    struct Record {
        partition: i32,
        offset: i64,
        event: OrderEvent,
        key: Uuid,
    }

    pub async fn run(spec: &ChildSpec, pool: PgPool) -> Result<(), BoxError> {
        let offsets_in_postgres = spec.contender.offsets_in_postgres;
        let context = HandContext {
            offsets_in_postgres,
            database: spec.database_url.parse()?,
            group: spec.group.clone(),
        };
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &spec.brokers)
            .set("group.id", &spec.group)
            .set("auto.offset.reset", "earliest")
            // idem-kafka's session and heartbeat.
            .set("session.timeout.ms", "30000")
            .set("heartbeat.interval.ms", "3000")
            .set("enable.auto.offset.store", "false");
        if offsets_in_postgres {
            config.set("enable.auto.commit", "false");
        } else {
            // Positions stored after each commit, committed every second (idem-kafka's
            // commit interval).
            config
                .set("enable.auto.commit", "true")
                .set("auto.commit.interval.ms", "1000");
        }
        let consumer: StreamConsumer<HandContext> = config.create_with_context(context)?;
        consumer.subscribe(&[&spec.topic])?;

        let consumer = Arc::new(consumer);
        let progress = Arc::new(Progress::default());
        if spec.lanes {
            lanes(spec, &pool, &consumer, &progress).await?;
        } else {
            // One loop: a batch (or a message) at a time, whatever its partitions.
            let mut batch: Vec<Record> = Vec::with_capacity(spec.contender.batch);
            while !progress.reached(&spec.end_offsets) {
                batch.clear();
                let message = consumer.recv().await?;
                batch.push(record(&message)?);
                drop(message);
                if spec.contender.batch > 1 {
                    let deadline = tokio::time::Instant::now() + BATCH_LINGER;
                    while batch.len() < spec.contender.batch {
                        match tokio::time::timeout_at(deadline, consumer.recv()).await {
                            Ok(message) => batch.push(record(&message?)?),
                            Err(_) => break,
                        }
                    }
                }
                apply(&pool, spec, &consumer, &progress, &batch).await?;
            }
        }
        say("done");
        if !offsets_in_postgres {
            consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync)?;
        }
        consumer.unsubscribe();
        Ok(())
    }

    /// What the consumer did so far, shared by its lanes.
    #[derive(Default)]
    struct Progress {
        /// Per partition, the offset after the last record done.
        positions: Mutex<HashMap<i32, i64>>,
        applied: AtomicU64,
        first: AtomicBool,
        /// Every partition is done.
        done: Notify,
    }

    impl Progress {
        fn reached(&self, end_offsets: &HashMap<i32, i64>) -> bool {
            reached(
                &self
                    .positions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
                end_offsets,
            )
        }
    }

    /// Applies `batch` (one message, or a batch) until it commits, then moves its
    /// partitions' positions on: in Kafka, stored in the client for the next commit.
    async fn apply(
        pool: &PgPool,
        spec: &ChildSpec,
        consumer: &StreamConsumer<HandContext>,
        progress: &Progress,
        batch: &[Record],
    ) -> Result<(), BoxError> {
        // A failure rolls back and runs the batch again: nothing is skipped.
        let new = loop {
            let done = if spec.contender.batch > 1 {
                apply_batch(pool, spec, batch).await
            } else {
                apply_one(pool, spec, &batch[0]).await.map(u64::from)
            };
            match done {
                Ok(new) => break new,
                Err(error) => {
                    eprintln!("hand-written consumer: {error}; again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let mut moved: HashMap<i32, i64> = HashMap::new();
        for record in batch {
            let next = moved.entry(record.partition).or_insert(0);
            *next = (*next).max(record.offset + 1);
        }
        if !spec.contender.offsets_in_postgres {
            for (partition, next) in &moved {
                consumer.store_offset(&spec.topic, *partition, *next)?;
            }
        }
        let reached = {
            let mut positions = progress
                .positions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (partition, next) in moved {
                let at = positions.entry(partition).or_insert(0);
                *at = (*at).max(next);
            }
            super::reached(&positions, &spec.end_offsets)
        };
        let applied = progress.applied.fetch_add(new, Ordering::SeqCst) + new;
        if applied > 0 && !progress.first.swap(true, Ordering::SeqCst) {
            say(&format!("first {applied}"));
        }
        if reached {
            progress.done.notify_one();
        }
        Ok(())
    }

    /// Each partition worked by a task of its own (its messages in order, a batch of its
    /// own messages at a time), as idem-kafka's member works its partitions: the loop
    /// receives and routes.
    async fn lanes(
        spec: &ChildSpec,
        pool: &PgPool,
        consumer: &Arc<StreamConsumer<HandContext>>,
        progress: &Arc<Progress>,
    ) -> Result<(), BoxError> {
        let mut lanes: HashMap<i32, mpsc::UnboundedSender<Record>> = HashMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let message = tokio::select! {
                () = progress.done.notified() => break,
                message = consumer.recv() => message?,
            };
            let record = record(&message)?;
            drop(message);
            let lane = lanes.entry(record.partition).or_insert_with(|| {
                let (to_lane, mut queue) = mpsc::unbounded_channel::<Record>();
                let (spec, pool, consumer, progress) = (
                    spec.clone(),
                    pool.clone(),
                    consumer.clone(),
                    progress.clone(),
                );
                tasks.spawn(async move {
                    let mut batch = Vec::with_capacity(spec.contender.batch);
                    while let Some(first) = queue.recv().await {
                        batch.clear();
                        batch.push(first);
                        let deadline = tokio::time::Instant::now() + BATCH_LINGER;
                        while batch.len() < spec.contender.batch {
                            match tokio::time::timeout_at(deadline, queue.recv()).await {
                                Ok(Some(record)) => batch.push(record),
                                _ => break,
                            }
                        }
                        apply(&pool, &spec, &consumer, &progress, &batch).await?;
                    }
                    Ok::<(), BoxError>(())
                });
                to_lane
            });
            lane.send(record).map_err(|_| "a lane ended")?;
        }
        drop(lanes);
        while let Some(lane) = tasks.join_next().await {
            lane??;
        }
        Ok(())
    }

    fn record(message: &rdkafka::message::BorrowedMessage<'_>) -> Result<Record, BoxError> {
        let event = decode(message.payload())?;
        let key = event.event_key.ok_or("an event without its key")?;
        Ok(Record {
            partition: message.partition(),
            offset: message.offset(),
            event,
            key,
        })
    }

    /// One message, one transaction: the claim, the business row of a new key, the
    /// position, the commit. Whether the key was new.
    async fn apply_one(pool: &PgPool, spec: &ChildSpec, record: &Record) -> Result<bool, BoxError> {
        let mut tx = pool.begin().await?;
        let new =
            sqlx::query("INSERT INTO processed_keys (key) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(record.key)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
        if new {
            sqlx::query(
                "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3)",
            )
            .bind(&record.event.order_id)
            .bind(event_type_name(record.event.event_type))
            .bind(record.event.amount_cents)
            .execute(&mut *tx)
            .await?;
        }
        if spec.contender.offsets_in_postgres {
            sqlx::query(
                "INSERT INTO consumer_offsets (consumer_group, topic, partition, next_offset)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset",
            )
            .bind(&spec.group)
            .bind(&spec.topic)
            .bind(record.partition)
            .bind(record.offset + 1)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(new)
    }

    /// A batch, one transaction, set-based: every key claimed by one statement that
    /// returns the new ones, their business rows by one statement, the partitions'
    /// positions by one, the commit. The facts applied.
    async fn apply_batch(
        pool: &PgPool,
        spec: &ChildSpec,
        batch: &[Record],
    ) -> Result<u64, BoxError> {
        let keys: Vec<Uuid> = batch.iter().map(|record| record.key).collect();
        let mut tx = pool.begin().await?;
        let new: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO processed_keys (key) SELECT * FROM unnest($1::uuid[])
             ON CONFLICT DO NOTHING RETURNING key",
        )
        .bind(&keys)
        .fetch_all(&mut *tx)
        .await?;
        let applied = new.len() as u64;
        if !new.is_empty() {
            let mut new: std::collections::HashSet<Uuid> = new.into_iter().collect();
            let (mut ids, mut types, mut amounts) = (Vec::new(), Vec::new(), Vec::new());
            // The first record of each new key, in the batch's order.
            for record in batch {
                if new.remove(&record.key) {
                    ids.push(record.event.order_id.as_str());
                    types.push(event_type_name(record.event.event_type));
                    amounts.push(record.event.amount_cents);
                }
            }
            sqlx::query(
                "INSERT INTO order_effects (order_id, event_type, amount_cents)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
            )
            .bind(&ids)
            .bind(&types)
            .bind(&amounts)
            .execute(&mut *tx)
            .await?;
        }
        let mut next: HashMap<i32, i64> = HashMap::new();
        for record in batch {
            let at = next.entry(record.partition).or_insert(0);
            *at = (*at).max(record.offset + 1);
        }
        if spec.contender.offsets_in_postgres {
            let (partitions, offsets): (Vec<i32>, Vec<i64>) = next.into_iter().unzip();
            sqlx::query(
                "INSERT INTO consumer_offsets (consumer_group, topic, partition, next_offset)
                 SELECT $1, $2, * FROM unnest($3::integer[], $4::bigint[])
                 ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset",
            )
            .bind(&spec.group)
            .bind(&spec.topic)
            .bind(&partitions)
            .bind(&offsets)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(applied)
    }
}

/// idem-kafka with the handler of the example users copy (examples/order_consumer.rs):
/// one message per transaction, or a batch handler (one body per batch).
mod by_idem {
    use super::*;

    /// Whether a fact was applied yet (for the `first` line).
    static FIRST: AtomicBool = AtomicBool::new(false);
    /// The facts applied so far.
    static APPLIED: AtomicU64 = AtomicU64::new(0);

    /// One message per transaction; with offsets in PostgreSQL the position is stored by
    /// the same transaction.
    #[idempotent(
        key = "event_key",
        fingerprint = "order_id, event_type, amount_cents",
        scope = "kafka_bench.apply_order_event",
        max_attempts = 3
    )]
    async fn apply_order_event(
        tx: &mut PgConnection,
        event: &OrderEvent,
        position: Option<&Position>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3)",
        )
        .bind(&event.order_id)
        .bind(event_type_name(event.event_type))
        .bind(event.amount_cents)
        .execute(&mut *tx)
        .await?;
        if let Some(position) = position {
            position.store(tx).await?;
        }
        Ok(())
    }

    /// A batch handler: the new messages of a batch written by one statement; with
    /// offsets in PostgreSQL the batch's positions stored first, in the same transaction.
    #[idempotent(
        key = "event_key",
        fingerprint = "order_id, event_type, amount_cents",
        scope = "kafka_bench.apply_order_events",
        max_attempts = 3
    )]
    async fn apply_order_events(
        tx: &mut PgConnection,
        events: &[&OrderEvent],
        positions: Option<&BatchPositions>,
    ) -> Result<(), sqlx::Error> {
        let written = async {
            if let Some(positions) = positions {
                positions.store_once(&mut *tx).await?;
            }
            let ids: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
            let types: Vec<&str> = events
                .iter()
                .map(|e| event_type_name(e.event_type))
                .collect();
            let amounts: Vec<i64> = events.iter().map(|e| e.amount_cents).collect();
            sqlx::query(
                "INSERT INTO order_effects (order_id, event_type, amount_cents)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
            )
            .bind(&ids)
            .bind(&types)
            .bind(&amounts)
            .execute(&mut *tx)
            .await
            .map(|_| ())
        };
        let result = written.await;
        if result.is_err()
            && let Some(positions) = positions
        {
            positions.forget();
        }
        result
    }

    struct OrderEvents;

    fn applied(fates: &[Fate]) {
        let executed = fates
            .iter()
            .filter(|fate| matches!(fate, Fate::Executed))
            .count() as u64;
        if executed > 0 {
            let total = APPLIED.fetch_add(executed, Ordering::Relaxed) + executed;
            if !FIRST.swap(true, Ordering::SeqCst) {
                say(&format!("first {total}"));
            }
        }
    }

    impl Handler for OrderEvents {
        type Message = OrderEvent;

        fn decode(&self, payload: &[u8]) -> Result<OrderEvent, String> {
            idem_kafka::decode_json(payload)
        }

        async fn handle(
            &self,
            idem: &Idem,
            event: &OrderEvent,
            position: Option<&Position>,
        ) -> Fate {
            let fate = Fate::of(apply_order_event(idem, event, position).await);
            applied(std::slice::from_ref(&fate));
            fate
        }

        fn stores_position(&self) -> bool {
            true
        }

        async fn handle_batch(
            &self,
            idem: &Idem,
            events: &[OrderEvent],
            positions: Option<&[Position]>,
        ) -> Vec<Fate> {
            let positions = positions.map(|positions| {
                let keys = events.iter().map(|event| {
                    apply_order_events_key(event)
                        .ok()
                        .map(|key| (key.key(), key.fingerprint()))
                });
                BatchPositions::new(idem, "kafka_bench.apply_order_events", positions, keys)
            });
            let fates: Vec<Fate> = apply_order_events(idem, events, positions.as_ref())
                .await
                .into_iter()
                .map(Fate::of)
                .collect();
            applied(&fates);
            fates
        }
    }

    pub async fn run(spec: &ChildSpec, pool: PgPool) -> Result<(), BoxError> {
        let idem = Idem::new(pool);
        let offsets = if spec.contender.offsets_in_postgres {
            OffsetStore::Postgres
        } else {
            OffsetStore::Kafka
        };
        let consumer = Consumer::builder(&spec.brokers, &spec.group, &spec.topic)
            .offsets(offsets)
            .batch_size(spec.contender.batch)
            .build(idem, OrderEvents)?;
        let stats = consumer.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let end_offsets = spec.end_offsets.clone();
        let topic = spec.topic.clone();
        let watch = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            loop {
                every.tick().await;
                if stats.caught_up(&topic, &end_offsets) {
                    say("done");
                    stop.send(()).ok();
                    return;
                }
            }
        });
        consumer
            .run(async move {
                stopped.await.ok();
            })
            .await?;
        watch.await?;
        Ok(())
    }
}
