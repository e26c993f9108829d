//! The consumer-group member: receives, hands to the handler, routes the fates, commits.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{ErrorChain, Idem};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use tracing::Instrument;

use crate::builder::{ConsumerBuilder, Settings};
use crate::context::GroupContext;
use crate::dead_letter;
use crate::delivery::Delivery;
use crate::error::ConsumerError;
use crate::fate::{Fate, Reason};
use crate::handler::Handler;
use crate::offset_store::OffsetStore;
use crate::offsets;
use crate::position::Position;
use crate::schema::{self, Schema};
use crate::stats::Stats;
use crate::telemetry;

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
    handler: H,
}

impl<H> fmt::Debug for Consumer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A message waiting to be processed, and whether an earlier round ran its handler (a
/// batch handled again from an earlier message that had to be retried).
struct Pending {
    delivery: Delivery,
    executed: bool,
}

impl Consumer<()> {
    /// A builder for a member of `group` reading `topic` from `brokers`
    /// (`host:port[,host:port...]`).
    pub fn builder(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder::new(brokers.into(), group.into(), topic.into())
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
                (settings.session_timeout.as_millis() / 4).to_string(),
            );
        for (name, value) in &settings.extra {
            client.set(name, value);
        }
        let consumer: StreamConsumer<GroupContext> = client.create_with_context(context)?;
        consumer.subscribe(&[&settings.topic])?;
        Ok(Consumer {
            consumer,
            idem,
            settings,
            schema,
            stats,
            handler,
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
        tracing::info!(
            group = %self.settings.group, topic = %self.settings.topic, offsets = %self.settings.offsets,
            batch_size = self.settings.batch_size, "consumer started"
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
            self.stats.received(deliveries.len());
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
        let deadline = tokio::time::Instant::now() + self.settings.batch_linger;
        while deliveries.len() < self.settings.batch_size {
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
        let mut backoff = self.settings.retry_backoff;
        let mut attempt = 0u32;
        loop {
            let fates = if self.settings.batch_size <= 1 && pending.len() == 1 {
                vec![self.handle_one(&pending[0].delivery).await]
            } else {
                // A retry takes the failing message on its own: if it fails again, the
                // messages behind it are not rolled back and redone one by one with it.
                let round = if attempt > 0 { 1 } else { pending.len() };
                self.stats.batch();
                self.handle_round(&mut pending[..round]).await
            };
            let done = fates.iter().take_while(|fate| fate.is_final()).count();
            let mut fates = fates.into_iter();
            for (item, fate) in pending.drain(..done).zip(fates.by_ref()) {
                let at = &item.delivery;
                let stored_in_tx = self.settings.offsets == OffsetStore::Postgres
                    && self.settings.batch_size <= 1
                    && match fate {
                        Fate::DeadLetter { .. } => true,
                        Fate::Executed => self.handler.stores_position(),
                        _ => false,
                    };
                self.consumer
                    .context()
                    .processed(&at.topic, at.partition, at.offset, stored_in_tx);
                self.stats
                    .processed(&at.topic, at.partition, at.offset, &fate);
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

    /// Handles one delivery once (the per-message path), in its `process` span.
    async fn handle_one(&self, delivery: &Delivery) -> Fate {
        let span = telemetry::process_span(
            &self.settings.group,
            &delivery.topic,
            delivery.partition,
            delivery.offset,
            1,
        );
        let handled = async {
            let message = match self.decode(delivery) {
                Ok(message) => message,
                Err(error) => {
                    return self
                        .dead_letter(delivery, Reason::Undecodable, &error, true)
                        .await;
                }
            };
            let position =
                (self.settings.offsets == OffsetStore::Postgres).then(|| self.position(delivery));
            let fate = self
                .handler
                .handle(&self.idem, &message, position.as_ref())
                .await;
            self.route(delivery, fate, false).await
        };
        let fate = handled.instrument(span.clone()).await;
        telemetry::record_fate(&span, &fate);
        fate
    }

    /// One round of the batch path over `pending`, in its `process` span: the fates of
    /// the messages done with, in order, up to and with the first one to retry.
    async fn handle_round(&self, pending: &mut [Pending]) -> Vec<Fate> {
        let first = &pending[0].delivery;
        let span = telemetry::process_span(
            &self.settings.group,
            &first.topic,
            first.partition,
            first.offset,
            pending.len(),
        );
        let fates = self
            .handle_round_in_span(pending)
            .instrument(span.clone())
            .await;
        if let Some(last) = fates.last() {
            telemetry::record_fate(&span, last);
        }
        fates
    }

    async fn handle_round_in_span(&self, pending: &mut [Pending]) -> Vec<Fate> {
        // Undecodable messages first, in their own transactions, without positions: the
        // batch transaction may then store positions past them.
        let mut decoded = Vec::with_capacity(pending.len());
        let mut slots = Vec::with_capacity(pending.len());
        let mut fates = Vec::with_capacity(pending.len());
        for item in pending.iter() {
            match self.decode(&item.delivery) {
                Ok(message) => {
                    slots.push(Some(decoded.len()));
                    decoded.push(message);
                }
                Err(error) => {
                    let fate = self
                        .dead_letter(&item.delivery, Reason::Undecodable, &error, false)
                        .await;
                    if !fate.is_final() {
                        // Nothing is routed before the failing dead letter is written.
                        return vec![fate];
                    }
                    slots.push(None);
                }
            }
        }
        let handled = if decoded.is_empty() {
            Vec::new()
        } else {
            let positions: Option<Vec<Position>> = (self.settings.offsets == OffsetStore::Postgres)
                .then(|| {
                    pending
                        .iter()
                        .zip(&slots)
                        .filter(|(_, slot)| slot.is_some())
                        .map(|(item, _)| self.position(&item.delivery))
                        .collect()
                });
            self.handler
                .handle_batch(&self.idem, &decoded, positions.as_deref())
                .await
        };
        for (item, slot) in pending.iter_mut().zip(&slots) {
            if let Some(fate) = slot.and_then(|index| handled.get(index)) {
                item.executed |= *fate == Fate::Executed;
            }
        }
        for (item, slot) in pending.iter().zip(slots) {
            let Some(index) = slot else {
                fates.push(Fate::DeadLetter {
                    reason: Reason::Undecodable,
                    error: String::new(),
                });
                continue;
            };
            let Some(fate) = handled.get(index).cloned() else {
                fates.push(Fate::retry("not handled in this round"));
                return fates;
            };
            let fate = self.route(&item.delivery, fate, item.executed).await;
            let retry = !fate.is_final();
            fates.push(fate);
            if retry {
                return fates;
            }
        }
        fates
    }

    fn decode(&self, delivery: &Delivery) -> Result<H::Message, String> {
        match delivery.payload.as_deref() {
            None => Err("the message has no payload".to_owned()),
            Some(payload) => self.handler.decode(payload),
        }
    }

    /// Routes a fate: dead letters are written (with the position, in the Postgres
    /// variant, in the same transaction). `executed_before`: an earlier round ran this
    /// message's handler, so a duplicate now is its own effect.
    async fn route(&self, delivery: &Delivery, fate: Fate, executed_before: bool) -> Fate {
        match fate {
            Fate::Duplicate if executed_before => Fate::Executed,
            Fate::DeadLetter { reason, error } => {
                self.dead_letter(delivery, reason, &error, true).await
            }
            other => other,
        }
    }

    /// Writes the delivery to the dead-letter table; in the Postgres variant and with
    /// `store_position`, stores the position after it in the same transaction.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: Reason,
        error: &str,
        store_position: bool,
    ) -> Fate {
        let written = async {
            // In a task of its own: sqlx 0.8 returns a connection to the pool inside an
            // open transaction when `begin` is dropped while `BEGIN` is in flight.
            let pool = self.idem.pool().clone();
            let mut tx = tokio::spawn(async move { pool.begin().await })
                .await
                .map_err(|joined| sqlx::Error::Io(std::io::Error::other(joined)))??;
            let new = dead_letter::insert(
                &mut tx,
                &self.schema,
                &self.settings.group,
                delivery,
                reason,
                error,
            )
            .await?;
            if store_position && self.settings.offsets == OffsetStore::Postgres {
                self.position(delivery).store(&mut tx).await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(new)
        };
        match written.await {
            Ok(new) => {
                tracing::warn!(
                    topic = %delivery.topic, partition = delivery.partition, offset = delivery.offset,
                    reason = reason.as_str(), %error, already_recorded = !new,
                    "message dead-lettered"
                );
                Fate::DeadLetter {
                    reason,
                    error: error.to_owned(),
                }
            }
            Err(db) => Fate::retry(format_args!(
                "dead-lettering the message failed ({}): {}",
                reason.as_str(),
                ErrorChain(&db)
            )),
        }
    }

    fn position(&self, delivery: &Delivery) -> Position {
        Position::new(
            &self.schema,
            self.settings.group.clone(),
            delivery.topic.clone(),
            delivery.partition,
            delivery.offset + 1,
        )
    }

    /// Stores the processed positions that are not stored yet (Postgres variant) and
    /// commits them to Kafka, without waiting for the broker.
    async fn save_progress(&self) {
        if self.store_progress().await {
            let context = self.consumer.context();
            context.commit(&self.consumer, CommitMode::Async);
        }
    }

    /// Postgres variant: stores the processed positions that are not stored yet. Returns
    /// whether the positions may be committed to Kafka (never ahead of PostgreSQL).
    async fn store_progress(&self) -> bool {
        let context = self.consumer.context();
        if context.killed() {
            return false;
        }
        if self.settings.offsets == OffsetStore::Postgres {
            let pending = context.unstored();
            if !pending.is_empty() {
                // In a task of its own: a transaction that `alone` begins must not be
                // dropped while `BEGIN` is in flight (sqlx 0.8 would hand its connection
                // back to the pool inside it).
                let stored = tokio::spawn({
                    let (pool, schema) = (self.idem.pool().clone(), self.schema.clone());
                    let (group, pending) = (self.settings.group.clone(), pending.clone());
                    async move {
                        let mut conn = pool.acquire().await?;
                        offsets::alone(&mut conn, &schema, async |conn| {
                            offsets::store_all(conn, &schema, &group, &pending).await
                        })
                        .await
                    }
                });
                let stored = stored
                    .await
                    .unwrap_or_else(|joined| Err(sqlx::Error::Io(std::io::Error::other(joined))));
                if let Err(error) = stored {
                    tracing::warn!(%error, "storing offsets in postgres failed; retrying at the next commit");
                    context.unstore(&pending);
                    return false;
                }
            }
        }
        true
    }

    /// Saves the progress (synchronously) and leaves the group.
    async fn close(self) -> Result<(), ConsumerError> {
        let commit_too = self.store_progress().await;
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
