//! One delivery of a partition (a message, or a batch of its messages) worked to its end
//! in a task of its own: handed to the [dispatcher](crate::dispatch), retried from the
//! first message whose failure can pass, with a growing back-off, until every message of
//! it is done, or the member's loop tells it to stop. It reports to the loop what it is
//! done with, in order; the loop keeps the positions (see [lanes](crate::lanes)).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};

use crate::delivery::Delivery;
use crate::dispatch::{Dispatcher, Pending};
use crate::fate::Fate;
use crate::handler::Handler;
use crate::handover::Key;
use crate::lanes::Ready;
use crate::progress::{PositionRow, Receipts};
use crate::stats::Stats;

/// What a worker tells the member's loop.
#[derive(Debug)]
pub(crate) enum Report {
    /// Messages done with, in order, after a round; `receipts`: the positions the round's
    /// batch transactions stored; `retrying`: the round ended on a message to retry
    /// (whether its key was in progress elsewhere).
    Done {
        key: Key,
        generation: u64,
        done: Vec<(Delivery, Fate)>,
        receipts: Vec<PositionRow>,
        retrying: Option<bool>,
    },
    /// The worker ended (every message done, or told to stop): its partition may start
    /// its next delivery. Its last report.
    Finished { key: Key, generation: u64 },
}

/// What every worker of a member shares.
pub(crate) struct Workers<H> {
    pub dispatch: Arc<Dispatcher<H>>,
    /// The member's bound: a permit for each attempt.
    pub permits: Arc<Semaphore>,
    pub reports: mpsc::UnboundedSender<Report>,
    pub stats: Arc<Stats>,
    pub batch_size: usize,
    pub retry_backoff: Duration,
    pub max_retry_backoff: Duration,
}

impl<H> Clone for Workers<H> {
    fn clone(&self) -> Self {
        Workers {
            dispatch: self.dispatch.clone(),
            permits: self.permits.clone(),
            reports: self.reports.clone(),
            stats: self.stats.clone(),
            batch_size: self.batch_size,
            retry_backoff: self.retry_backoff,
            max_retry_backoff: self.max_retry_backoff,
        }
    }
}

impl<H: Handler> Workers<H> {
    /// Works `ready` to its end (or until told to stop), then reports it finished.
    pub async fn work(self, ready: Ready) {
        let Ready {
            key,
            generation,
            deliveries,
            mut stop,
        } = ready;
        self.rounds(&key, generation, deliveries, &mut stop).await;
        // The loop outlives its workers, but for a kill (then nobody listens).
        self.reports.send(Report::Finished { key, generation }).ok();
    }

    /// The rounds of one delivery, the retries included.
    async fn rounds(
        &self,
        key: &Key,
        generation: u64,
        deliveries: Vec<Delivery>,
        stop: &mut watch::Receiver<bool>,
    ) {
        let mut pending: Vec<Pending> = deliveries.into_iter().map(Pending::new).collect();
        // The positions this delivery's batch transactions store, for the loop to confirm.
        let receipts = Arc::new(Receipts::default());
        let mut backoff = self.retry_backoff;
        let mut attempt = 0u32;
        loop {
            // A permit of the member's bound for the attempt, never for a back-off.
            let permit = tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                permit = self.permits.acquire() => permit,
            };
            let fates = if self.batch_size <= 1 && pending.len() == 1 {
                vec![
                    self.dispatch
                        .handle_one(&pending[0].delivery, &receipts)
                        .await,
                ]
            } else {
                // A retry takes the failing message on its own: if it fails again, the
                // messages behind it are not rolled back and redone one by one with it.
                let round = if attempt > 0 { 1 } else { pending.len() };
                self.stats.batch();
                self.dispatch
                    .handle_round(&mut pending[..round], &receipts)
                    .await
            };
            drop(permit);
            let done_count = fates.iter().take_while(|fate| fate.is_final()).count();
            let mut fates = fates.into_iter();
            let done: Vec<(Delivery, Fate)> = pending
                .drain(..done_count)
                .map(|item| item.delivery)
                .zip(fates.by_ref())
                .collect();
            let retry = match fates.next() {
                Some(Fate::Retry { error, in_progress }) => Some((error, in_progress)),
                _ => None,
            };
            self.reports
                .send(Report::Done {
                    key: key.clone(),
                    generation,
                    done,
                    receipts: receipts.drain(),
                    retrying: retry.as_ref().map(|(_, in_progress)| *in_progress),
                })
                .ok();
            let Some((error, in_progress)) = retry else {
                if pending.is_empty() {
                    return;
                }
                // The retried message is done: the rest of the batch, together again.
                backoff = self.retry_backoff;
                attempt = 0;
                continue;
            };
            if done_count > 0 {
                // A new message failed: its own back-off.
                backoff = self.retry_backoff;
                attempt = 0;
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
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.max_retry_backoff);
        }
    }
}
