//! The rdkafka context of a consumer: partition progress, rebalances and commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, RebalanceProtocol,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use crate::handover::{Handed, Handover, Key};
use crate::offset_store::OffsetStore;
use crate::progress::{Pending, PositionRow, Progress};
use crate::schema::Schema;
use crate::store;

/// How long a rebalance waits for PostgreSQL, connecting included, before it goes on
/// without it (see [`GroupContext::on_side_thread`]).
const SIDE_JOB_BOUND: Duration = Duration::from_secs(10);

/// The rdkafka context: rebalance handling and the processed offsets.
pub(crate) struct GroupContext {
    pub group: String,
    pub offsets: OffsetStore,
    pub schema: Schema,
    pub progress: Arc<Progress>,
    pub killed: Arc<AtomicBool>,
    /// What the rebalance callback hands over to the member's loop.
    pub handover: Handover,
    database: PgConnectOptions,
}

impl GroupContext {
    pub fn new(
        group: String,
        offsets: OffsetStore,
        schema: Schema,
        database: PgConnectOptions,
    ) -> Self {
        GroupContext {
            group,
            offsets,
            schema,
            progress: Arc::default(),
            killed: Arc::new(AtomicBool::new(false)),
            handover: Handover::default(),
            database,
        }
    }

    pub fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// Commits the processed positions not committed yet to Kafka (unless killed).
    pub fn commit(&self, consumer: &impl rdkafka::consumer::Consumer<Self>, mode: CommitMode) {
        if self.killed() {
            return;
        }
        let to_commit = self.progress.uncommitted();
        if to_commit.count() > 0
            && let Err(error) = consumer.commit(&to_commit, mode)
        {
            tracing::warn!(%error, "committing offsets to kafka failed; retrying at the next commit");
            self.progress.uncommit(&to_commit);
        }
    }

    /// Postgres variant, on assignment: start each partition at its stored offset, and
    /// remember it as what PostgreSQL holds (the floor of the positions stored later).
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
            let load = async |conn: &mut PgConnection| {
                store::alone(conn, &self.schema, async |conn| {
                    store::stored_offsets(conn, &self.schema, &self.group, topic).await
                })
                .await
            };
            match self.on_side_thread(load) {
                Ok(stored) => {
                    for (_, partition) in partitions.iter().filter(|(t, _)| t == topic) {
                        self.progress
                            .assigned(topic, *partition, stored.get(partition).copied());
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
                Err(error) => {
                    for (_, partition) in partitions.iter().filter(|(t, _)| t == topic) {
                        self.progress.assigned(topic, *partition, None);
                    }
                    tracing::warn!(
                        topic, %error,
                        "cannot read the stored offsets; starting at kafka's committed offsets (duplicates, nothing skipped)"
                    )
                }
            }
        }
    }

    /// On revocation: store and commit what was processed in the revoked partitions,
    /// then forget them. Blocks (the commit, and the store on a thread of its own).
    pub fn save_revoked(
        &self,
        base: &impl rdkafka::consumer::Consumer<Self>,
        revoked: &TopicPartitionList,
    ) {
        let keys: Vec<(String, i32)> = revoked
            .elements()
            .iter()
            .map(|element| (element.topic().to_owned(), element.partition()))
            .collect();
        let entries = self.progress.remove(&keys);
        if self.killed() {
            return;
        }
        if self.offsets == OffsetStore::Postgres {
            let pending: Pending = entries
                .iter()
                .filter(|(_, entry)| entry.next > entry.stored)
                .map(|((topic, partition), entry)| PositionRow {
                    topic: topic.clone(),
                    partition: *partition,
                    next_offset: entry.next,
                    floor: entry.confirmed,
                })
                .collect();
            if !pending.is_empty() {
                let store = async |conn: &mut PgConnection| {
                    store::alone(conn, &self.schema, async |conn| {
                        store::store_positions(conn, &self.schema, &self.group, &pending).await
                    })
                    .await
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

    /// Gives up revoked `partitions` whose deliveries are done: resumes them (a pause of
    /// the member's outlives the assignment in librdkafka), stores and commits what was
    /// processed in them, and unassigns them.
    /// Blocks, giving up the runtime's worker meanwhile (see [`blocking`]).
    pub fn give_up(
        &self,
        base: &impl rdkafka::consumer::Consumer<Self>,
        partitions: &TopicPartitionList,
        cooperative: bool,
    ) {
        blocking(|| {
            base.resume(partitions).ok();
            self.save_revoked(base, partitions);
            let unassigned = if cooperative {
                base.incremental_unassign(partitions)
            } else {
                base.unassign()
            };
            log_rebalance("revoked", &describe(partitions), unassigned);
        });
    }

    /// Runs a short database job from inside an rdkafka callback, which is synchronous:
    /// on a thread of its own with its own connection, so that it never waits for the
    /// runtime the callback was called on (a current-thread runtime is blocked in it), at
    /// most [`SIDE_JOB_BOUND`], connection included.
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
                        tokio::time::timeout(SIDE_JOB_BOUND, work)
                            .await
                            .unwrap_or_else(|_| {
                                Err(sqlx::Error::Io(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    format!(
                                        "PostgreSQL did not connect and answer within {SIDE_JOB_BOUND:?}"
                                    ),
                                )))
                            })
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
    /// Called by librdkafka from the member's poll, on the member's task: it blocks
    /// (stored offsets read, revoked positions stored and committed), giving up the
    /// runtime's worker meanwhile (see [`blocking`]).
    fn rebalance(
        &self,
        base: &BaseConsumer<Self>,
        event: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        blocking(|| self.rebalance_here(base, event, partitions));
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            tracing::debug!(%error, "an offset commit failed; retrying at the next commit");
            self.progress.uncommit(offsets);
        }
    }
}

impl GroupContext {
    fn rebalance_here(
        &self,
        base: &BaseConsumer<Self>,
        event: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let described = describe(partitions);
        let listed: Vec<(String, i32)> = partitions
            .elements()
            .iter()
            .map(|element| (element.topic().to_owned(), element.partition()))
            .collect();
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
                self.progress.hold(&listed);
                log_rebalance("assigned", &described, assigned);
                self.handover.hand(Handed::Assigned(listed));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.progress.release(&listed);
                if self.handover.defers(&listed) {
                    // librdkafka waits for the unassign call, holding the partitions'
                    // fetches: the loop makes it once their deliveries are done.
                    tracing::info!(
                        partitions = described,
                        "partitions revoked; finishing their deliveries in flight before giving them up"
                    );
                    self.handover.hand(Handed::Revoking {
                        partitions: listed,
                        cooperative,
                    });
                    return;
                }
                self.give_up(base, partitions, cooperative);
                self.handover.hand(Handed::Revoked(listed));
            }
            other => {
                tracing::error!(error = ?other, "rebalance failed; dropping the assignment");
                self.progress.clear();
                base.unassign().ok();
                self.handover.hand(Handed::Dropped);
            }
        }
    }
}

/// Runs `work`, which blocks (a read or write in PostgreSQL, a commit to the broker), from
/// an rdkafka callback or the member's loop. On a worker of a multi-threaded Tokio
/// runtime, the worker's other tasks move to another thread while it blocks
/// ([`tokio::task::block_in_place`]): the other members' deliveries, whatever else the
/// process runs, and what the work itself may wait for, such as an in-process tunnel or
/// proxy to the database. Elsewhere (a current-thread runtime, a thread of its own) it
/// just runs.
fn blocking<R>(work: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// The list of `keys`, without offsets.
pub(crate) fn list_of(keys: &[Key]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (topic, partition) in keys {
        list.add_partition(topic, *partition);
    }
    list
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
