//! The batch transaction: the claim, the body's work and the commit, and the one-by-one
//! pass over the claimed messages when it rolls back.

use std::future::Future;

use super::claim::{Claim, claim};
use super::plan::{Derived, Indexed};
use super::timed::Window;
use crate::Idem;
use crate::current::CurrentDelivery;
use crate::faults;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::handler_key::MessageKeys;
use crate::key_transaction::{Ended, KeyTransaction};
use crate::outcome::{Error, HandlerError, Outcome};
use crate::telemetry::{Mode, Timer};
use crate::transactional;

/// The outcome of the batch transaction.
pub(super) enum Pass<T, E> {
    /// Committed (or nothing to commit): the outcomes of the messages it decided.
    Committed(Vec<Indexed<T, E>>),
    /// Rolled back: the messages in `retry` go one by one; `decided` stand.
    OneByOne {
        retry: Vec<usize>,
        decided: Vec<Indexed<T, E>>,
        reason: Fallback,
    },
}

/// Claims the keys of the messages `to_claim` and, if any is owned, hands the open
/// transaction, the owned messages and the duplicates the claim found (both in message
/// order) to `work`, which runs the body and commits. With nothing owned, the transaction is dropped without a write.
/// `window`: where the keys are kept by their facts' times, the scope's window.
pub(super) async fn batch_pass<T, E, C, W, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    to_claim: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    window: Option<Window>,
    codec: &C,
    work: W,
) -> Pass<T, E>
where
    C: ResultCodec<T>,
    W: FnOnce(KeyTransaction, i64, Vec<usize>, Vec<usize>) -> Fut,
    Fut: Future<Output = Result<Vec<Indexed<T, E>>, Fallback>>,
{
    let claiming = Timer::start();
    let claimed = claim(idem, spec, to_claim, keyed, window, codec).await;
    claiming.claim(spec.scope, Mode::Batch);
    match claimed {
        Ok(None) => Pass::Committed(Vec::new()),
        Ok(Some(Claim {
            tx: Some(tx),
            xid,
            owned,
            decided,
            succeeded,
        })) if !owned.is_empty() => {
            match work(tx, xid.unwrap_or_default(), owned.clone(), succeeded).await {
                Ok(executed) => {
                    let mut outcomes = decided;
                    outcomes.extend(executed);
                    Pass::Committed(outcomes)
                }
                Err(reason) => Pass::OneByOne {
                    retry: owned,
                    decided,
                    reason,
                },
            }
        }
        // Read-only (or no transaction at all): dropping the transaction rolls it back
        // before its connection is reused.
        Ok(Some(Claim { tx, decided, .. })) => {
            drop(tx);
            Pass::Committed(decided)
        }
        Err(reason) => Pass::OneByOne {
            retry: to_claim.to_vec(),
            decided: Vec::new(),
            reason,
        },
    }
}

/// The outcomes of the messages the batch pass handled: as committed, or, when the batch
/// rolled back, each message in `retry` run on its own by [`run_transactional`](crate::transactional::run_transactional()), its body
/// given by `one` (the transaction and the message's index). `previous_timed`: the
/// handler's previous keys are in the time buckets (`previous_event_time`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn settle<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    pass: Pass<T, E>,
    keyed: &impl Fn(usize) -> MessageKeys,
    previous_timed: bool,
    codec: C,
    one: F,
) -> Vec<Indexed<T, E>>
where
    C: ResultCodec<T> + Copy,
    E: HandlerError,
    F: FnMut(KeyTransaction, usize) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let (retry, mut decided, reason) = match pass {
        Pass::Committed(outcomes) => return outcomes,
        Pass::OneByOne {
            retry,
            decided,
            reason,
        } => (retry, decided, reason),
    };
    if let Fallback::TransactionEnded { xid } = reason {
        tracing::warn!(
            scope = spec.scope,
            messages = retry.len(),
            "{reason}; its keys are parked"
        );
        for index in retry {
            let keys = keyed(index);
            let key = keys.key;
            transactional::park_ended(
                idem,
                spec,
                &[(key, keys.fingerprint())],
                keys.fact_time,
                xid,
            )
            .await;
            decided.push((index, Err(Error::TransactionEnded { key })));
        }
        return decided;
    }
    tracing::debug!(
        scope = spec.scope,
        messages = retry.len(),
        reason = %reason,
        "batch rolled back; processing its messages one by one"
    );
    decided.extend(each_alone(idem, spec, retry, keyed, previous_timed, codec, one).await);
    decided
}

/// Runs each message of `indices` on its own, in order, by
/// [`run_transactional`](crate::transactional::run_transactional())'s protocol, its body
/// given by `one` (the transaction and the message's index).
pub(super) async fn each_alone<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    indices: Vec<usize>,
    keyed: &impl Fn(usize) -> MessageKeys,
    previous_timed: bool,
    codec: C,
    mut one: F,
) -> Vec<Indexed<T, E>>
where
    C: ResultCodec<T> + Copy,
    E: HandlerError,
    F: FnMut(KeyTransaction, usize) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let mut decided = Vec::with_capacity(indices.len());
    for index in indices {
        let outcome = transactional::run_checked(
            idem,
            spec,
            Mode::Batch,
            keyed(index),
            previous_timed,
            codec,
            |tx| one(tx, index),
        )
        .await;
        decided.push((index, outcome));
    }
    decided
}

/// Why the batch transaction was abandoned for per-message processing.
#[derive(Debug, thiserror::Error)]
pub(super) enum Fallback {
    #[error("a handler failed")]
    HandlerFailed,
    /// A body ended the batch transaction itself: what followed it may have been
    /// committed outside the transaction, so no message of the batch runs again.
    #[error("a body ended the batch transaction (COMMIT or ROLLBACK in the body)")]
    TransactionEnded { xid: i64 },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The handler declares `previous_key`: each message claims its key under both
    /// definitions, on its own.
    #[error("the handler declares previous_key")]
    PreviousKey,
}

/// Commits the batch transaction `xid`, with the check of
/// [`Statements::commit`](crate::store::Statements::commit) in the same round trip.
/// `at_commit`: what the bodies left for the commit's round trip.
pub(super) async fn commit(
    idem: &Idem,
    tx: KeyTransaction,
    xid: i64,
    at_commit: &[String],
) -> Result<(), Fallback> {
    // Tests only: a connection lost before the batch's commit (a no-op without the
    // feature `testing`).
    if let Some(lost) = faults::before_commit(idem.faults()) {
        let _ = tx.rollback().await;
        return Err(Fallback::Database(lost));
    }
    match tx.commit(&idem.statements().commit_only(at_commit)).await {
        Ok(()) => Ok(()),
        Err(error) if transactional::ended_by_body(&error) => {
            Err(Fallback::TransactionEnded { xid })
        }
        Err(error) => Err(Fallback::Database(error)),
    }
}

/// Rolls the batch transaction `xid` back after a body failed: the messages go one by one,
/// unless the body had ended the transaction itself (what it ran afterwards is committed,
/// so none of the batch runs again).
async fn failed(tx: KeyTransaction, xid: i64) -> Fallback {
    match tx.rollback_after_failure().await {
        Ok(Ended::ByBody) => Fallback::TransactionEnded { xid },
        Ok(Ended::ByRollback) => Fallback::HandlerFailed,
        Err(error) => Fallback::Database(error),
    }
}

/// [`run_batch`](super::protocol::run_batch)'s work in the batch transaction: the body for each owned message, in order,
/// one statement storing the results, the commit.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_each<'m, M, T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    mut tx: KeyTransaction,
    xid: i64,
    messages: &'m [M],
    owned: Vec<usize>,
    keyed: &impl Fn(usize) -> Derived,
    codec: C,
    body: &mut F,
) -> Result<Vec<Indexed<T, E>>, Fallback>
where
    C: ResultCodec<T>,
    F: FnMut(KeyTransaction, &'m M) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let mut stored_keys = Vec::new();
    let mut stored_results = Vec::new();
    let mut stored_times = Vec::new();
    let mut values = Vec::with_capacity(owned.len());
    let mut at_commit = Vec::new();
    for index in owned {
        let current = CurrentDelivery::one(idem, spec.scope, keyed(index).key);
        let (returned, result) = current.clone().run(body(tx, &messages[index])).await;
        at_commit.extend(current.take_at_commit());
        tx = returned;
        let Ok(value) = result else {
            return Err(failed(tx, xid).await);
        };
        // An unencodable result fails this message alone, in the per-message pass.
        let Ok(stored) = codec.encode(&value) else {
            return Err(Fallback::HandlerFailed);
        };
        if let Some(stored) = stored {
            let derived = keyed(index);
            stored_keys.push(derived.key.as_uuid());
            stored_results.push(stored);
            stored_times.extend(derived.fact_time);
        }
        values.push((index, value));
    }
    if !stored_keys.is_empty() {
        // Keys kept by their facts' times have one each.
        let times = (stored_times.len() == stored_keys.len()).then_some(stored_times.as_slice());
        idem.statements()
            .store_batch_results(&mut tx, spec.scope, &stored_keys, &stored_results, times)
            .await?;
    }
    // A body that swallowed a failed statement left the transaction aborted, or ended it
    // itself: the check fails then, where a bare COMMIT would lose the claims silently.
    commit(idem, tx, xid, &at_commit).await?;
    Ok(values
        .into_iter()
        .map(|(index, value)| (index, Ok(Outcome::Executed(value))))
        .collect())
}

/// What the batch transaction's claim found, by message index, each in message order:
/// the messages whose keys it holds, and the duplicates (keys `success` with the
/// message's payload).
pub(super) struct Claimed {
    pub(super) owned: Vec<usize>,
    pub(super) succeeded: Vec<usize>,
}

/// [`run_batch_handler`](super::protocol::run_batch_handler)'s work in the batch transaction: the body once with all owned messages,
/// in order, then the commit.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_once<'m, M, E, F, Fut>(
    idem: &Idem,
    scope: &'static str,
    tx: KeyTransaction,
    xid: i64,
    messages: &'m [M],
    claimed: Claimed,
    keyed: &impl Fn(usize) -> Derived,
    body: &mut F,
) -> Result<Vec<Indexed<(), E>>, Fallback>
where
    F: FnMut(KeyTransaction, Vec<&'m M>) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<(), E>)>,
{
    let Claimed { owned, succeeded } = claimed;
    let slice = owned.iter().map(|&index| &messages[index]).collect();
    let keys = owned.iter().map(|&index| keyed(index).key).collect();
    let duplicates = succeeded.iter().map(|&index| keyed(index).key).collect();
    let running = Timer::start();
    let current = CurrentDelivery::many(idem, scope, keys, duplicates);
    let (tx, result) = current.clone().run(body(tx, slice)).await;
    running.handler(scope, Mode::Batch);
    if result.is_err() {
        return Err(failed(tx, xid).await);
    }
    // As in `run_each`: an aborted or ended transaction fails the check.
    commit(idem, tx, xid, &current.take_at_commit()).await?;
    Ok(owned
        .into_iter()
        .map(|index| (index, Ok(Outcome::Executed(()))))
        .collect())
}
