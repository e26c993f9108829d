//! The workers that deliver the queue: several at once, one message at a time on the
//! shared handle, one on a handle whose transactions are `SERIALIZABLE`, and one through
//! the batch path. Some deliveries are aborted at random, as a cancelled task or a
//! timeout would.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::{Disposition, Error, Idem, Outcome};

use crate::deliveries::{Fate, Plan, Reason, Route};
use crate::fault_counts::FaultCounts;
use crate::ledger::{self, Hooks, Payment};
use crate::seeded_random::SeededRandom;
use crate::settlement::Settlement;

/// What every worker and injector shares.
pub struct Run {
    /// The messages.
    pub plan: Plan,
    /// The queue and the fates.
    pub settlement: Arc<Settlement>,
    /// The bodies' hooks.
    pub hooks: Arc<Hooks>,
    /// The handle most deliveries use (with the Redis cache).
    pub idem: Idem,
    /// A handle whose transactions are `SERIALIZABLE` (another pool, the same cache).
    pub serializable: Idem,
    /// The counters of injected faults.
    pub counts: Arc<FaultCounts>,
    /// Deliveries aborted or dropped at random, per thousand (0 once the chaos stops).
    pub abort_per_mille: AtomicU64,
}

impl Run {
    fn abort_rate(&self) -> u64 {
        self.abort_per_mille.load(Ordering::Relaxed)
    }
}

/// What one delivery of a message came to.
#[derive(Debug)]
pub enum Attempt {
    /// Settled.
    Done(Fate),
    /// Deliver it again later.
    Retry(Why),
    /// Not delivered: it reuses the key of a message that has not settled yet.
    Waiting,
}

/// Why a delivery is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `Error::InProgress`: another delivery holds the key.
    InProgress,
    /// `Error::LeaseLost`: the lease ran out and another worker took the key over.
    LeaseLost,
    /// The delivery was aborted or dropped.
    Aborted,
    /// Any other error with `Disposition::Retry`.
    Failed,
}

/// Delivers message `id` once, through `idem`.
pub async fn deliver(run: &Run, idem: &Idem, id: usize) -> Attempt {
    let message = &run.plan.messages[id];
    if let Some(original) = message.variant_of
        && !run.settlement.is_settled(original)
    {
        return Attempt::Waiting;
    }
    run.settlement.deliveries.fetch_add(1, Ordering::Relaxed);
    let Ok(payment) = serde_json::from_slice::<Payment>(&message.payload) else {
        return Attempt::Done(Fate::DeadLetter(Reason::Undecodable));
    };
    let hooks = &*run.hooks;
    match message.route {
        Route::Ledger => judge(ledger::apply_payment(idem, &payment, hooks).await),
        Route::External => judge(ledger::notify_payment(idem, &payment, hooks).await),
        Route::Receipt => judge(ledger::record_receipt(idem, &payment, hooks).await),
    }
}

/// What a consumer makes of a handler's answer.
pub fn judge<T, E: Display>(result: Result<Outcome<T>, Error<E>>) -> Attempt {
    let error = match result {
        Ok(_) => return Attempt::Done(Fate::Applied),
        Err(error) => error,
    };
    match error.disposition() {
        Disposition::Retry => Attempt::Retry(match error {
            Error::InProgress { .. } => Why::InProgress,
            Error::LeaseLost { .. } => Why::LeaseLost,
            _ => Why::Failed,
        }),
        Disposition::DeadLetter => Attempt::Done(Fate::DeadLetter(match error {
            Error::Key(_) => Reason::MissingKey,
            Error::PayloadMismatch { .. } => Reason::PayloadMismatch,
            Error::Parked { .. } | Error::Handler { parked: true, .. } => Reason::Parked,
            other => Reason::Unexpected(other.to_string()),
        })),
        _ => panic!("a delivery asked to halt: {error}"),
    }
}

/// Records what a delivery of message `id` came to: its fate, or a retry after a pause.
pub fn conclude(run: &Run, random: &mut SeededRandom, id: usize, attempt: Attempt) {
    match attempt {
        Attempt::Done(fate) => run.settlement.settle(id, fate),
        Attempt::Retry(why) => {
            let pause = match why {
                Why::InProgress | Why::LeaseLost => random.between(100, 400),
                Why::Aborted | Why::Failed => random.between(10, 150),
            };
            run.settlement.retry_later(id, Duration::from_millis(pause));
        }
        Attempt::Waiting => run
            .settlement
            .retry_later(id, Duration::from_millis(random.between(50, 200))),
    }
}

/// Delivers message `id`, aborting or dropping the delivery at a random point now and
/// then.
pub async fn deliver_or_abort(
    run: &Arc<Run>,
    idem: &Idem,
    random: &mut SeededRandom,
    id: usize,
) -> Attempt {
    if !random.chance(run.abort_rate()) {
        return deliver(run, idem, id).await;
    }
    let after = Duration::from_millis(random.between(0, 40));
    if random.chance(500) {
        // Dropped: a timeout around the delivery.
        match tokio::time::timeout(after, deliver(run, idem, id)).await {
            Ok(attempt) => attempt,
            Err(_) => {
                FaultCounts::bump(&run.counts.dropped_futures);
                Attempt::Retry(Why::Aborted)
            }
        }
    } else {
        // Aborted: the task running it is cancelled.
        let task = tokio::spawn({
            let (run, idem) = (Arc::clone(run), idem.clone());
            async move { deliver(&run, &idem, id).await }
        });
        tokio::time::sleep(after).await;
        task.abort();
        match task.await {
            Ok(attempt) => attempt,
            Err(error) if error.is_cancelled() => {
                FaultCounts::bump(&run.counts.aborted_tasks);
                Attempt::Retry(Why::Aborted)
            }
            Err(error) => panic!("a delivery panicked: {error}"),
        }
    }
}

/// Delivers the queue one message at a time through `idem` until every message is
/// settled and the queue is empty.
pub async fn one_by_one(run: Arc<Run>, idem: Idem, mut random: SeededRandom) {
    while !run.settlement.finished() {
        let Some(id) = run.settlement.take() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let attempt = deliver_or_abort(&run, &idem, &mut random, id).await;
        conclude(&run, &mut random, id, attempt);
    }
}

/// Delivers the queue in batches through `apply_payment_batch` (the other routes one by
/// one) until every message is settled and the queue is empty.
pub async fn in_batches(run: Arc<Run>, batch_size: usize, mut random: SeededRandom) {
    let idem = run.idem.clone();
    while !run.settlement.finished() {
        let mut batch: Vec<(usize, Payment)> = Vec::new();
        while batch.len() < batch_size {
            let Some(id) = run.settlement.take() else {
                break;
            };
            let message = &run.plan.messages[id];
            let decoded = serde_json::from_slice::<Payment>(&message.payload);
            match decoded {
                Ok(payment) if message.route == Route::Ledger && message.variant_of.is_none() => {
                    batch.push((id, payment));
                }
                _ => {
                    let attempt = deliver_or_abort(&run, &idem, &mut random, id).await;
                    conclude(&run, &mut random, id, attempt);
                }
            }
        }
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        run.settlement
            .deliveries
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let payments: Vec<Payment> = batch.iter().map(|(_, payment)| payment.clone()).collect();
        let delivery = ledger::apply_payment_batch(&idem, &payments, &run.hooks);
        let outcomes = if random.chance(run.abort_rate()) {
            let after = Duration::from_millis(random.between(0, 60));
            match tokio::time::timeout(after, delivery).await {
                Ok(outcomes) => Some(outcomes),
                Err(_) => {
                    FaultCounts::bump(&run.counts.dropped_futures);
                    None
                }
            }
        } else {
            Some(delivery.await)
        };
        match outcomes {
            Some(outcomes) => {
                for ((id, _), outcome) in batch.iter().zip(outcomes) {
                    conclude(&run, &mut random, *id, judge(outcome));
                }
            }
            None => {
                for (id, _) in &batch {
                    conclude(&run, &mut random, *id, Attempt::Retry(Why::Aborted));
                }
            }
        }
    }
}
