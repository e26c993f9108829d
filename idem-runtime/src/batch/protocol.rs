//! The batch protocol: the entry points that generated code calls, the claim of a
//! batch's keys, the batch transaction and the one-by-one pass after a rollback (see the
//! [module docs](super)).

use std::collections::{HashMap, HashSet};
use std::future::Future;

use uuid::Uuid;

use super::BatchOutcomes;
use crate::Idem;
use crate::faults;
use crate::handler::{BatchResult, HandlerSpec, NoResult, ResultCodec};
use crate::inflight::KeyTurn;
use crate::key::{IdempotencyKey, KeyError};
use crate::key_transaction::KeyTransaction;
use crate::outcome::{Error, Handled, HandlerError, Outcome};
use crate::scope;
use crate::store::Status;
use crate::telemetry::{self, Mode, Timer};
use crate::transactional;

/// A message's key and payload fingerprint, as the handler derives them.
type Derived = (IdempotencyKey, Option<[u8; 32]>);

/// One message's outcome, with its index in the batch.
type Indexed<T, E> = (usize, Result<Outcome<T>, Error<E>>);

/// What happens to one message of the batch.
enum Plan {
    /// Decided before the batch transaction (key error, payload mismatch inside the batch).
    Done,
    /// A duplicate of the message at this earlier index of the batch.
    SameAs(usize),
    /// Claimed, or to be decided by the claim.
    Claim,
}

/// The messages of a batch with their keys, and the outcomes decided so far.
struct Planned<T, E> {
    outcomes: Vec<Option<Result<Outcome<T>, Error<E>>>>,
    derived: Vec<Option<Derived>>,
    plans: Vec<Plan>,
}

/// Every message refused for the same reason (the handler's scope is not its own).
fn refuse_all<M, T, E>(messages: &[M], error: scope::Error) -> BatchOutcomes<T, E> {
    match error {
        scope::Error::Conflict(conflict) => messages
            .iter()
            .map(|_| Err(Error::ScopeConflict(conflict.clone())))
            .collect(),
        scope::Error::Database(error) => {
            let text = error.to_string();
            messages
                .iter()
                .map(|_| Err(Error::Database(sqlx::Error::Protocol(text.clone()))))
                .collect()
        }
    }
}

impl<T, E> Planned<T, E> {
    /// Derives every message's key; decides key errors and duplicates inside the batch.
    fn new<'m, M>(
        messages: &'m [M],
        mut derive: impl FnMut(&'m M) -> Result<Derived, KeyError>,
    ) -> Self {
        let mut planned = Planned {
            outcomes: messages.iter().map(|_| None).collect(),
            derived: Vec::with_capacity(messages.len()),
            plans: Vec::with_capacity(messages.len()),
        };
        let mut first_of_key: HashMap<IdempotencyKey, usize> = HashMap::new();
        for (index, message) in messages.iter().enumerate() {
            match derive(message) {
                Err(error) => {
                    planned.outcomes[index] = Some(Err(Error::Key(error)));
                    planned.derived.push(None);
                    planned.plans.push(Plan::Done);
                }
                Ok((key, fingerprint)) => {
                    match first_of_key.get(&key) {
                        Some(&first) => {
                            let same_payload = match (&planned.derived[first], fingerprint) {
                                (Some((_, Some(theirs))), Some(ours)) => *theirs == ours,
                                _ => true,
                            };
                            if same_payload {
                                planned.plans.push(Plan::SameAs(first));
                            } else {
                                planned.outcomes[index] = Some(Err(Error::PayloadMismatch { key }));
                                planned.plans.push(Plan::Done);
                            }
                        }
                        None => {
                            first_of_key.insert(key, index);
                            planned.plans.push(Plan::Claim);
                        }
                    }
                    planned.derived.push(Some((key, fingerprint)));
                }
            }
        }
        planned
    }

    /// The messages whose keys the batch claims, in message order. A key that another
    /// delivery of this process is working on is not waited for: its message gets
    /// [`Error::InProgress`] and the rest of the batch goes on. The turns taken end when
    /// the batch transaction does (before a one-by-one pass, which takes them again).
    fn take_turns<'i>(
        &mut self,
        idem: &'i Idem,
        scope: &'static str,
    ) -> (Vec<usize>, Vec<KeyTurn<'i>>) {
        let mut to_claim = Vec::with_capacity(self.plans.len());
        let mut turns = Vec::with_capacity(self.plans.len());
        for index in 0..self.plans.len() {
            if !matches!(self.plans[index], Plan::Claim) {
                continue;
            }
            let (key, _) = self.keyed(index);
            if let Some(turn) = idem.in_flight().try_take(scope, key.as_uuid()) {
                to_claim.push(index);
                turns.push(turn);
            } else {
                self.outcomes[index] = Some(Err(Error::InProgress { key }));
                self.plans[index] = Plan::Done;
            }
        }
        (to_claim, turns)
    }

    /// The key and fingerprint of a message that has a key.
    fn keyed(&self, index: usize) -> Derived {
        self.derived[index].expect("claimed messages have keys")
    }

    fn decide(&mut self, decided: impl IntoIterator<Item = Indexed<T, E>>) {
        for (index, outcome) in decided {
            self.outcomes[index] = Some(outcome);
        }
    }

    /// Every message's outcome, in order: duplicates inside the batch share the outcome
    /// of the first message with their key.
    fn finish<C: ResultCodec<T>>(mut self, codec: &C) -> BatchOutcomes<T, E> {
        for index in 0..self.plans.len() {
            if let Plan::SameAs(first) = self.plans[index] {
                let (key, _) = self.keyed(index);
                self.outcomes[index] = Some(match &self.outcomes[first] {
                    Some(Ok(Outcome::Executed(value) | Outcome::Duplicate(Some(value)))) => {
                        replay(codec, key, value)
                    }
                    Some(Ok(Outcome::Duplicate(None))) | None => Ok(Outcome::Duplicate(None)),
                    Some(Err(error)) => Err(same_error(error, key)),
                });
            }
        }
        self.outcomes
            .into_iter()
            .map(|outcome| outcome.expect("every message has an outcome"))
            .collect()
    }
}

/// Runs `body` for every message of `messages` whose key has not succeeded yet, in one
/// transaction with the claims of all their keys.
///
/// `derive` gives each message's key and payload fingerprint. `body` receives the open
/// transaction and one message and hands the transaction back with its result. Returns
/// one outcome per message, in order. This is what `#[idempotent(batch = true)]`
/// generates a call of (as `<handler>_batch`).
pub async fn run<'m, M, T, E, C, D, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    messages: &'m [M],
    derive: D,
    codec: C,
    mut body: F,
) -> BatchOutcomes<T, E>
where
    C: ResultCodec<T> + Copy,
    E: HandlerError,
    D: FnMut(&'m M) -> Result<Derived, KeyError>,
    F: FnMut(KeyTransaction, &'m M) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    if let Err(error) = idem.check_scope(spec, scope::handler_identity::<F>()).await {
        return counted(spec, refuse_all(messages, error));
    }
    let mut planned = Planned::new(messages, derive);
    let (to_claim, turns) = planned.take_turns(idem, spec.scope);
    let keyed = |index: usize| planned.keyed(index);
    let (each, derived) = (&mut body, &keyed);
    let pass = batch_pass(
        idem,
        spec,
        &to_claim,
        &keyed,
        &codec,
        move |tx, xid, owned| run_each(idem, spec, tx, xid, messages, owned, derived, codec, each),
    )
    .await;
    drop(turns);
    let outcomes = settle(idem, spec, pass, &keyed, codec, |tx, index| {
        body(tx, &messages[index])
    })
    .await;
    planned.decide(outcomes);
    counted(spec, planned.finish(&codec))
}

/// Runs the body of a **batch handler** once for all messages of `messages` whose keys
/// have not succeeded yet, in one transaction with the claims of all their keys.
///
/// `derive` gives each message's key and payload fingerprint, as for [`run`]. `body`
/// receives the open transaction and the claimed messages, in message order (never
/// none), and hands the transaction back with its result, `Result<(), E>`. Returns one
/// outcome per message, in order (a [`BatchOutcomes<(), E>`](BatchOutcomes)):
/// [`Outcome::Executed`] for the messages the body received,
/// [`Outcome::Duplicate(None)`](Outcome::Duplicate) for those already processed (nothing
/// is stored for replay).
///
/// When the body fails, the batch rolls back and each claimed message is processed on
/// its own by [`transactional::run`](crate::transactional::run()), the body receiving a
/// slice of that one message (see the [module docs](super)). So the body may run more than
/// once, each earlier run rolled back as a whole.
///
/// A handler whose message parameter is a slice, `#[idempotent(key = "...")] async fn
/// h(tx: &mut PgConnection, events: &[&M]) -> Result<(), E>`, generates a call of this
/// function.
pub async fn run_bulk<'m, M, R, D, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    messages: &'m [M],
    derive: D,
    mut body: F,
) -> Vec<Handled<R>>
where
    R: BatchResult,
    R::Error: HandlerError,
    D: FnMut(&'m M) -> Result<Derived, KeyError>,
    F: FnMut(KeyTransaction, Vec<&'m M>) -> Fut,
    Fut: Future<Output = (KeyTransaction, R)>,
{
    if let Err(error) = idem.check_scope(spec, scope::handler_identity::<F>()).await {
        return counted(spec, refuse_all(messages, error));
    }
    let mut planned = Planned::new(messages, derive);
    let (to_claim, turns) = planned.take_turns(idem, spec.scope);
    let keyed = |index: usize| planned.keyed(index);
    let mut body = |tx, slice| {
        let running = body(tx, slice);
        async move {
            let (tx, result) = running.await;
            (tx, result.into_result())
        }
    };
    let once = &mut body;
    let pass = batch_pass(
        idem,
        spec,
        &to_claim,
        &keyed,
        &NoResult,
        move |tx, xid, owned| run_once(idem, spec.scope, tx, xid, messages, owned, once),
    )
    .await;
    drop(turns);
    let outcomes = settle(idem, spec, pass, &keyed, NoResult, |tx, index| {
        body(tx, vec![&messages[index]])
    })
    .await;
    planned.decide(outcomes);
    counted(spec, planned.finish(&NoResult))
}

/// Counts each message's outcome (see [`telemetry`](crate::telemetry)).
fn counted<T, E>(spec: &HandlerSpec, outcomes: BatchOutcomes<T, E>) -> BatchOutcomes<T, E> {
    for outcome in &outcomes {
        telemetry::count(spec.scope, Mode::Batch, telemetry::outcome_label(outcome));
    }
    outcomes
}

/// The outcome of the batch transaction.
enum Pass<T, E> {
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
/// transaction and the owned messages (in message order) to `work`, which runs the body
/// and commits. With nothing owned, the transaction is dropped without a write.
async fn batch_pass<T, E, C, W, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    to_claim: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    codec: &C,
    work: W,
) -> Pass<T, E>
where
    C: ResultCodec<T>,
    W: FnOnce(KeyTransaction, i64, Vec<usize>) -> Fut,
    Fut: Future<Output = Result<Vec<Indexed<T, E>>, Fallback>>,
{
    let claiming = Timer::start();
    let claimed = claim(idem, spec, to_claim, keyed, codec).await;
    claiming.claim(spec.scope, Mode::Batch);
    match claimed {
        Ok(None) => Pass::Committed(Vec::new()),
        Ok(Some(Claim {
            tx, owned, decided, ..
        })) if owned.is_empty() => {
            // Read-only: dropping the transaction rolls it back before its connection is
            // reused.
            drop(tx);
            Pass::Committed(decided)
        }
        Ok(Some(Claim {
            tx,
            xid,
            owned,
            decided,
        })) => match work(tx, xid.unwrap_or_default(), owned.clone()).await {
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
        },
        Err(reason) => Pass::OneByOne {
            retry: to_claim.to_vec(),
            decided: Vec::new(),
            reason,
        },
    }
}

/// The outcomes of the messages the batch pass handled: as committed, or, when the batch
/// rolled back, each message in `retry` run on its own by [`transactional::run`], its body
/// given by `one` (the transaction and the message's index).
async fn settle<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    pass: Pass<T, E>,
    keyed: &impl Fn(usize) -> Derived,
    codec: C,
    mut one: F,
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
            let (key, fingerprint) = keyed(index);
            let fingerprint = fingerprint.as_ref().map(<[u8; 32]>::as_slice);
            transactional::park_ended(idem, spec, &[(key, fingerprint)], xid).await;
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
    for index in retry {
        let (key, fingerprint) = keyed(index);
        let outcome =
            transactional::run_checked(idem, spec, Mode::Batch, key, fingerprint, codec, |tx| {
                one(tx, index)
            })
            .await;
        decided.push((index, outcome));
    }
    decided
}

/// A duplicate's copy of a value, through the codec (as a duplicate from the table gets it).
fn replay<T, E, C: ResultCodec<T>>(
    codec: &C,
    key: IdempotencyKey,
    value: &T,
) -> Result<Outcome<T>, Error<E>> {
    let stored = codec.encode(value).map_err(Error::ResultEncoding)?;
    codec
        .decode(stored)
        .map(Outcome::Duplicate)
        .map_err(|source| Error::StoredResult { key, source })
}

/// What a duplicate inside the batch is told when the first message with its key failed.
fn same_error<E>(error: &Error<E>, key: IdempotencyKey) -> Error<E> {
    match error {
        Error::Parked {
            attempts,
            last_error,
            ..
        } => Error::Parked {
            key,
            attempts: *attempts,
            last_error: last_error.clone(),
        },
        Error::PayloadMismatch { .. } => Error::PayloadMismatch { key },
        // The first delivery failed or is in progress: this one may be retried later.
        _ => Error::InProgress { key },
    }
}

/// Why the batch transaction was abandoned for per-message processing.
#[derive(Debug, thiserror::Error)]
enum Fallback {
    #[error("a handler failed")]
    HandlerFailed,
    /// A body ended the batch transaction itself: what followed it may have been
    /// committed outside the transaction, so no message of the batch runs again.
    #[error("a body ended the batch transaction (COMMIT or ROLLBACK in the body)")]
    TransactionEnded { xid: i64 },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Commits the batch transaction `xid`, with the check of
/// [`Statements::commit`](crate::store::Statements::commit) in the same round trip.
async fn commit(idem: &Idem, tx: KeyTransaction, xid: i64) -> Result<(), Fallback> {
    // Tests only: a connection lost before the batch's commit (a no-op without the
    // feature `testing`).
    if let Some(lost) = faults::before_commit(idem.faults()) {
        let _ = tx.rollback().await;
        return Err(Fallback::Database(lost));
    }
    match tx.commit(idem.statements().commit_only()).await {
        Ok(()) => Ok(()),
        Err(error) if transactional::ended_by_body(&error) => {
            Err(Fallback::TransactionEnded { xid })
        }
        Err(error) => Err(Fallback::Database(error)),
    }
}

/// The batch transaction after the claim of its keys.
struct Claim<T, E> {
    tx: KeyTransaction,
    /// The transaction's id, checked by the commit (`None` while nothing is owned).
    xid: Option<i64>,
    /// The messages whose keys this transaction holds, in message order.
    owned: Vec<usize>,
    /// The messages decided by the rows in the way (duplicates, parked keys, payload
    /// mismatches).
    decided: Vec<Indexed<T, E>>,
}

/// Opens the batch transaction and claims the keys of the messages `to_claim` in one
/// statement; `failed` keys in the way are taken over in one more. `None` when there is
/// nothing to claim (no transaction is opened then).
async fn claim<T, E, C: ResultCodec<T>>(
    idem: &Idem,
    spec: &HandlerSpec,
    to_claim: &[usize],
    keyed: &impl Fn(usize) -> Derived,
    codec: &C,
) -> Result<Option<Claim<T, E>>, Fallback> {
    if to_claim.is_empty() {
        return Ok(None);
    }
    let scope = spec.scope;
    let keys: Vec<Uuid> = to_claim.iter().map(|&i| keyed(i).0.as_uuid()).collect();
    let fingerprints: Vec<Option<Vec<u8>>> = to_claim
        .iter()
        .map(|&i| keyed(i).1.map(|f| f.to_vec()))
        .collect();

    let body_lock_timeout = idem.session_lock_timeout().await?;
    let mut tx = idem.key_transaction().await?;
    let statements = idem.statements();
    let claimed = statements
        .claim_batch(&mut tx, scope, &keys, &fingerprints, body_lock_timeout)
        .await?;
    let mut xid = claimed.xid;
    if claimed.in_the_way.is_empty() {
        return Ok(Some(Claim {
            tx,
            xid,
            owned: to_claim.to_vec(),
            decided: Vec::new(),
        }));
    }
    let position: HashMap<Uuid, usize> = to_claim
        .iter()
        .map(|&index| (keyed(index).0.as_uuid(), index))
        .collect();
    let mut in_the_way = HashSet::with_capacity(claimed.in_the_way.len());
    let mut failed = Vec::new();
    let mut decided = Vec::new();
    for (key, existing) in claimed.in_the_way {
        let index = position[&key];
        in_the_way.insert(index);
        let (idempotency_key, fingerprint) = keyed(index);
        let Some(existing) = existing else {
            // Committed by a transaction this claim waited for: decide it on its own.
            return Err(Fallback::Database(sqlx::Error::RowNotFound));
        };
        let mismatch =
            crate::transactional::mismatched(fingerprint.as_ref().map(|f| f.as_slice()), &existing);
        if mismatch {
            decided.push((
                index,
                Err(Error::PayloadMismatch {
                    key: idempotency_key,
                }),
            ));
        } else if existing.status == Status::Failed {
            failed.push(index);
        } else {
            decided.push((
                index,
                transactional::decide(idempotency_key, existing, codec),
            ));
        }
    }
    let mut owned: Vec<usize> = to_claim
        .iter()
        .copied()
        .filter(|index| !in_the_way.contains(index))
        .collect();
    if !failed.is_empty() {
        let failed_keys: Vec<Uuid> = failed.iter().map(|&i| keyed(i).0.as_uuid()).collect();
        let failed_fingerprints: Vec<Option<Vec<u8>>> = failed
            .iter()
            .map(|&i| keyed(i).1.map(|f| f.to_vec()))
            .collect();
        let retaken = statements
            .retake_batch(&mut tx, scope, &failed_keys, &failed_fingerprints)
            .await?;
        xid = xid.or(retaken.first().map(|&(_, xid)| xid));
        // The claim left the lock timeout bounded for this takeover: the body runs with
        // the session's own.
        statements
            .restore_lock_timeout(&mut tx, body_lock_timeout)
            .await?;
        if retaken.len() != failed.len() {
            // Another delivery finished one of them meanwhile: decide them one by one.
            return Err(Fallback::Database(sqlx::Error::RowNotFound));
        }
        owned.extend(failed);
    }
    owned.sort_unstable();
    Ok(Some(Claim {
        tx,
        xid,
        owned,
        decided,
    }))
}

/// [`run`]'s work in the batch transaction: the body for each owned message, in order,
/// one statement storing the results, the commit.
#[allow(clippy::too_many_arguments)]
async fn run_each<'m, M, T, E, C, F, Fut>(
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
    let mut values = Vec::with_capacity(owned.len());
    for index in owned {
        let (returned, result) = body(tx, &messages[index]).await;
        tx = returned;
        let Ok(value) = result else {
            return Err(Fallback::HandlerFailed);
        };
        // An unencodable result fails this message alone, in the per-message pass.
        let Ok(stored) = codec.encode(&value) else {
            return Err(Fallback::HandlerFailed);
        };
        if let Some(stored) = stored {
            stored_keys.push(keyed(index).0.as_uuid());
            stored_results.push(stored);
        }
        values.push((index, value));
    }
    if !stored_keys.is_empty() {
        idem.statements()
            .store_batch_results(&mut tx, spec.scope, &stored_keys, &stored_results)
            .await?;
    }
    // A body that swallowed a failed statement left the transaction aborted, or ended it
    // itself: the check fails then, where a bare COMMIT would lose the claims silently.
    commit(idem, tx, xid).await?;
    Ok(values
        .into_iter()
        .map(|(index, value)| (index, Ok(Outcome::Executed(value))))
        .collect())
}

/// [`run_bulk`]'s work in the batch transaction: the body once with all owned messages,
/// in order, then the commit.
async fn run_once<'m, M, E, F, Fut>(
    idem: &Idem,
    scope: &str,
    tx: KeyTransaction,
    xid: i64,
    messages: &'m [M],
    owned: Vec<usize>,
    body: &mut F,
) -> Result<Vec<Indexed<(), E>>, Fallback>
where
    F: FnMut(KeyTransaction, Vec<&'m M>) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<(), E>)>,
{
    let slice = owned.iter().map(|&index| &messages[index]).collect();
    let running = Timer::start();
    let (tx, result) = body(tx, slice).await;
    running.handler(scope, Mode::Batch);
    if result.is_err() {
        return Err(Fallback::HandlerFailed);
    }
    // As in `run_each`: an aborted or ended transaction fails the check.
    commit(idem, tx, xid).await?;
    Ok(owned
        .into_iter()
        .map(|index| (index, Ok(Outcome::Executed(()))))
        .collect())
}
