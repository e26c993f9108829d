//! Hands deliveries to the handler and routes their fates: decoding, the `process` spans,
//! dead letters (with the position after them, offsets in PostgreSQL). Knows nothing of
//! the Kafka client: the consumer's loop receives, retries and commits around it.

use std::sync::Arc;

use idem_runtime::{ErrorChain, Idem};
use tracing::Instrument;

use crate::delivery::Delivery;
use crate::fate::{Fate, Reason};
use crate::handler::Handler;
use crate::offset_store::OffsetStore;
use crate::outbox::{TRACE_HEADER, TraceContext};
use crate::position::Position;
use crate::progress::{Progress, Receipts};
use crate::received::Received;
use crate::schema::Schema;
use crate::store;
use crate::telemetry;

/// A message waiting to be processed, and whether an earlier round ran its handler (a
/// batch handled again from an earlier message that had to be retried).
pub(crate) struct Pending {
    pub delivery: Delivery,
    pub executed: bool,
}

impl Pending {
    pub fn new(delivery: Delivery) -> Self {
        Pending {
            delivery,
            executed: false,
        }
    }
}

/// What handling a delivery needs: the handle, the handler, the group and where its
/// positions and dead letters are kept.
pub(crate) struct Dispatcher<H> {
    pub idem: Idem,
    pub handler: H,
    pub group: String,
    pub offsets: OffsetStore,
    pub schema: Schema,
    /// The member's progress: the floors of the positions handed out.
    pub progress: Arc<Progress>,
}

impl<H: Handler> Dispatcher<H> {
    /// Handles one delivery once (the per-message path), in its `process` span.
    /// `receipts`: where the positions handed out note what their transactions stored.
    pub async fn handle_one(&self, delivery: &Delivery, receipts: &Arc<Receipts>) -> Fate {
        let span = telemetry::process_span(
            &self.group,
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
                        .dead_letter(delivery, Reason::Undecodable, &error, Some(receipts))
                        .await;
                }
            };
            let position =
                (self.offsets == OffsetStore::Postgres).then(|| self.position(delivery, receipts));
            let trace = TraceContext::of_incoming(delivery.header(TRACE_HEADER));
            tracing::Span::current().record("trace_parent", trace.trace_id());
            let fate = trace
                .run(self.handler.handle(&self.idem, &message, position.as_ref()))
                .await;
            self.route(delivery, fate, false, receipts).await
        };
        let fate = handled.instrument(span.clone()).await;
        telemetry::record_fate(&span, &fate);
        fate
    }

    /// One round of the batch path over `pending`, in its `process` span: the fates of
    /// the messages done with, in order, up to and with the first one to retry. What the
    /// round's transactions stored is in `receipts` when it returns: what PostgreSQL holds
    /// now.
    pub async fn handle_round(
        &self,
        pending: &mut [Pending],
        receipts: &Arc<Receipts>,
    ) -> Vec<Fate> {
        let first = &pending[0].delivery;
        let span = telemetry::process_span(
            &self.group,
            &first.topic,
            first.partition,
            first.offset,
            pending.len(),
        );
        let fates = self
            .handle_round_in_span(pending, receipts)
            .instrument(span.clone())
            .await;
        if let Some(last) = fates.last() {
            telemetry::record_fate(&span, last);
        }
        fates
    }

    async fn handle_round_in_span(
        &self,
        pending: &mut [Pending],
        receipts: &Arc<Receipts>,
    ) -> Vec<Fate> {
        // Undecodable messages first, in their own transactions, without positions: the
        // batch transaction may then store positions past them.
        let (decoded, slots) = match self.decode_round(pending).await {
            Ok(decoded) => decoded,
            Err(fate) => return vec![fate],
        };
        let handled = if decoded.is_empty() {
            Vec::new()
        } else {
            let positions: Option<Vec<Position>> =
                (self.offsets == OffsetStore::Postgres).then(|| {
                    pending
                        .iter()
                        .zip(&slots)
                        .filter(|(_, slot)| slot.is_some())
                        .map(|(item, _)| self.position(&item.delivery, receipts))
                        .collect()
                });
            // The batch's records carry the trace of its first message.
            let first = pending
                .first()
                .and_then(|item| item.delivery.header(TRACE_HEADER));
            let trace = TraceContext::of_incoming(first);
            tracing::Span::current().record("trace_parent", trace.trace_id());
            trace
                .run(
                    self.handler
                        .handle_batch(&self.idem, &decoded, positions.as_deref()),
                )
                .await
        };
        for (item, slot) in pending.iter_mut().zip(&slots) {
            if let Some(fate) = slot.and_then(|index| handled.get(index)) {
                item.executed |= *fate == Fate::Executed;
            }
        }
        self.route_round(pending, &slots, handled, receipts).await
    }

    /// Decodes the messages of a round: the decoded ones, and per message its index among
    /// them (`None`: undecodable, dead-lettered here). `Err`: a dead letter could not be
    /// written, and nothing is routed before it is.
    async fn decode_round(
        &self,
        pending: &[Pending],
    ) -> Result<(Vec<H::Message>, Vec<Option<usize>>), Fate> {
        let mut decoded = Vec::with_capacity(pending.len());
        let mut slots = Vec::with_capacity(pending.len());
        for item in pending {
            match self.decode(&item.delivery) {
                Ok(message) => {
                    slots.push(Some(decoded.len()));
                    decoded.push(message);
                }
                Err(error) => {
                    let fate = self
                        .dead_letter(&item.delivery, Reason::Undecodable, &error, None)
                        .await;
                    if !fate.is_final() {
                        return Err(fate);
                    }
                    slots.push(None);
                }
            }
        }
        Ok((decoded, slots))
    }

    /// Routes the fates of a round in message order, up to and with the first one to
    /// retry (a message the handler gave no fate is retried).
    async fn route_round(
        &self,
        pending: &[Pending],
        slots: &[Option<usize>],
        handled: Vec<Fate>,
        receipts: &Arc<Receipts>,
    ) -> Vec<Fate> {
        let mut fates = Vec::with_capacity(pending.len());
        for (item, slot) in pending.iter().zip(slots) {
            let Some(index) = *slot else {
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
            let fate = self
                .route(&item.delivery, fate, item.executed, receipts)
                .await;
            let retry = !fate.is_final();
            fates.push(fate);
            if retry {
                return fates;
            }
        }
        fates
    }

    fn decode(&self, delivery: &Delivery) -> Result<H::Message, String> {
        self.handler.decode_received(&Received::new(delivery))
    }

    /// Routes a fate: dead letters are written (with the position, in the Postgres
    /// variant, in the same transaction). `executed_before`: an earlier round ran this
    /// message's handler, so a duplicate now is its own effect.
    async fn route(
        &self,
        delivery: &Delivery,
        fate: Fate,
        executed_before: bool,
        receipts: &Arc<Receipts>,
    ) -> Fate {
        match fate {
            Fate::Duplicate if executed_before => Fate::Executed,
            Fate::DeadLetter { reason, error } => {
                self.dead_letter(delivery, reason, &error, Some(receipts))
                    .await
            }
            other => other,
        }
    }

    /// Writes the delivery to the dead-letter table; in the Postgres variant and with
    /// `store_position` (the receipts of its positions), stores the position after it in
    /// the same transaction.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: Reason,
        error: &str,
        store_position: Option<&Arc<Receipts>>,
    ) -> Fate {
        let written = async {
            // In a task of its own: sqlx 0.8 returns a connection to the pool inside an
            // open transaction when `begin` is dropped while `BEGIN` is in flight.
            let pool = self.idem.pool().clone();
            let mut tx = tokio::spawn(async move { pool.begin().await })
                .await
                .map_err(|joined| sqlx::Error::Io(std::io::Error::other(joined)))??;
            let new = store::insert_dead_letter(
                &mut tx,
                &self.schema,
                &self.group,
                delivery,
                reason,
                error,
            )
            .await?;
            if let Some(receipts) = store_position
                && self.offsets == OffsetStore::Postgres
            {
                self.position(delivery, receipts).store(&mut tx).await?;
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

    /// The position after `delivery`, guarded by what the member knows PostgreSQL holds.
    fn position(&self, delivery: &Delivery, receipts: &Arc<Receipts>) -> Position {
        Position::new(
            &self.schema,
            self.group.clone(),
            delivery.topic.clone(),
            delivery.partition,
            delivery.offset + 1,
        )
        .with_floor(
            self.progress.floor(&delivery.topic, delivery.partition),
            receipts,
        )
    }
}
