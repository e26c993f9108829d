//! The transactional protocol: claim, run and mark a key in the handler's own transaction.
//!
//! Before anything reaches PostgreSQL, the handler's scope is checked (see
//! [`crate::scope`]) and the Redis cache is asked where there is one. While duplicates are
//! frequent in the scope (a redelivery storm: a quarter of the recent deliveries or more),
//! one plain read of the key's row, outside any transaction, answers them with no lock and
//! no write; the read only saves work, a key without a final row goes on as below. The
//! delivery then takes the key's turn in the process: another delivery of the same key in
//! this process is waited for here, holding no connection, at most the lock timeout. Then
//! one transaction per delivery:
//!
//! 1. `BEGIN; SET LOCAL lock_timeout = ...` (one round trip), on a connection held by a
//!    [`KeyTransaction`], which rolls the transaction back if the delivery is dropped;
//! 2. claim: one prepared statement inserts the key as `success` (`INSERT ... ON CONFLICT
//!    DO NOTHING`), returning the transaction's id. A claim of the same key by another
//!    process waits inside its `INSERT` until this transaction ends, at most the lock
//!    timeout. When a row is in the way, a second statement reads it, or takes it over
//!    under its row lock when it is `failed`. A claim that wins sets the session's own
//!    lock timeout back for the body;
//! 3. the body, on the same connection;
//! 4. one simple query: a check that the transaction is still open and not aborted
//!    (`SAVEPOINT`, which PostgreSQL refuses in both cases, with no plan and no snapshot),
//!    the result where there is one to store (`UPDATE` of the row claimed in step 2), and
//!    `COMMIT`: the business effects and the key's `success` become visible together.
//!    Nothing follows: the connection goes back to the pool with no transaction to end.
//!
//! A row found in step 2 decides without running the body: `success` is a duplicate
//! (its stored result is replayed; no lock, no write), `parked` is refused. When the body
//! fails, the transaction rolls back and the failure is recorded by a short transaction of
//! its own that never overwrites a `success` written meanwhile: the happy path pays nothing
//! for the failure path. A failure that PostgreSQL reports when the transaction commits (a
//! deferred constraint, a body that swallowed a failed statement) is recorded the same way,
//! so that a message that can never commit is parked after `max_attempts`; a body that ends
//! the transaction itself (`COMMIT` or `ROLLBACK`, or `begin()` on its connection) gets
//! [`Error::TransactionEnded`] and its key is parked, whether the body then returns `Ok` or
//! an error (in a batch, every key of the batch: nothing of it runs again). A lost or
//! killed connection, a server shutdown, a lock timeout is not the message's fault and
//! counts no attempt, in the body or at the commit; a serialization failure or deadlock is
//! run again a few times, and counts once it persists.

use std::future::Future;

use chrono::{DateTime, Utc};
use tracing::Instrument;

use crate::Idem;
use crate::current::CurrentDelivery;
use crate::faults::BackendKill;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::definition::KeyLayout;
use crate::key::handler_key::MessageKeys;
use crate::key::{IdempotencyKey, KeyError};
use crate::key_transaction::KeyTransaction;
use crate::outcome::{Error, HandlerError, Outcome};
use crate::scope;
use crate::store::Status;
use crate::telemetry::{self, Mode, Timer};

mod claim;
mod failure;
mod finish;
mod retries;

pub(crate) use claim::{decide, fact_window, mismatched, outside_window, representable};
pub(crate) use failure::{
    counts_as_attempt, counts_as_attempt_of, ended_by_body, is_lock_timeout, park_ended,
};
use retries::Retries;

/// Runs `body` at most once to success for `keys.key` in `spec.scope`, in one transaction
/// with the claim of the key. This is what `#[idempotent]` generates a call of.
///
/// `keys.fingerprint`, where given, is compared with the one recorded with the key: a
/// different one is [`Error::PayloadMismatch`]. `keys.previous`, the key under the
/// handler's previous key definition, is claimed in the same transaction, first: a fact
/// that succeeded under it is a duplicate. `layout` describes the handler's key for the
/// scope's check. `codec` stores the body's value for replay to duplicates.
///
/// `body` receives the open transaction and hands it back with its result; it must not
/// commit or roll it back, nor begin a transaction of its own on it (see
/// `KeyTransaction`). It may run more than once when PostgreSQL reports a
/// serialization failure or a deadlock: each earlier run was rolled back as a whole.
pub async fn run_transactional<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    layout: &KeyLayout<'_>,
    keys: MessageKeys,
    codec: C,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnMut(KeyTransaction) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let identity = scope::handler_identity::<F>();
    let span = telemetry::span(spec.scope, keys.key, Mode::Transaction);
    let result = async {
        // A handler with `event_time` whose message has no time for it: its key is not
        // in the status table either.
        if let (Some(field), None) = (layout.event_time, keys.fact_time) {
            return Err(Error::Key(KeyError::MissingValue { field }));
        }
        idem.check_scope(spec, identity, layout).await?;
        let previous_timed = layout.previous_timed();
        run_delivery(
            idem,
            spec,
            Mode::Transaction,
            keys,
            previous_timed,
            codec,
            body,
        )
        .await
    }
    .instrument(span.clone())
    .await;
    telemetry::finish(&span, spec.scope, Mode::Transaction, &result);
    result
}

/// [`run_transactional`] for a handler whose scope is checked already (the batch path's
/// one-by-one pass). `previous_timed`: its previous keys, where it declares some, are in
/// the time buckets (`previous_event_time`), not in the status table.
pub(crate) async fn run_checked<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    mode: Mode,
    keys: MessageKeys,
    previous_timed: bool,
    codec: C,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnMut(KeyTransaction) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    run_delivery(idem, spec, mode, keys, previous_timed, codec, body).await
}

/// [`run_transactional`] once the scope is checked. `previous_timed`: the key under the
/// previous definition is in the time buckets, in the bucket of the fact's time
/// (`previous_event_time`); otherwise in the status table.
///
/// One step per stage of the module docs: a duplicate answered without the claim, the
/// key's turn in the process, then, in a loop that a transient failure starts again, the
/// claim, the body, and the commit or the failure.
pub(crate) async fn run_delivery<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    mode: Mode,
    keys: MessageKeys,
    previous_timed: bool,
    codec: C,
    mut body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnMut(KeyTransaction) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let key = keys.key;
    let delivery = Delivery {
        idem,
        spec,
        mode,
        key,
        fingerprint: keys.fingerprint(),
        previous: keys.previous,
        fact_time: keys.fact_time,
        previous_time: keys.fact_time.filter(|_| previous_timed),
    };
    if let Some(answer) = delivery.answer_without_claim(&codec).await {
        return answer;
    }
    // Other deliveries of the key in this process go first, without a connection held.
    let Some(_turn) = idem
        .in_flight()
        .wait(spec.scope, key.as_uuid(), idem.config().lock_timeout())
        .await
    else {
        return Err(Error::InProgress { key });
    };
    // Read (once per handle) before a connection is held for the transaction.
    let body_lock_timeout = idem.session_lock_timeout().await?;
    let mut retries = Retries::new(idem.config().transient_retries());
    loop {
        let (mut tx, xid) = match delivery
            .claim(&codec, body_lock_timeout, &mut retries)
            .await
        {
            Step::Go(owned) => owned,
            Step::Done(answer) => return answer,
            Step::Again => continue,
        };
        // Tests only: a fault armed on the handle (a no-op without the feature `testing`).
        let mut kill = BackendKill::at_claim(idem.faults(), idem.pool(), &mut tx).await;
        let running = Timer::start();
        let current = CurrentDelivery::one(idem, spec.scope, key);
        let (tx, result) = kill.during_body(current.clone().run(body(tx))).await;
        running.handler(spec.scope, mode);
        let step = match result {
            Ok(value) => {
                let at_commit = current.take_at_commit();
                delivery
                    .commit(tx, xid, value, &codec, &at_commit, &mut kill, &mut retries)
                    .await
            }
            Err(error) => delivery.fail(tx, xid, error, &mut retries).await,
        };
        match step {
            Step::Go(never) => match never {},
            Step::Done(answer) => return answer,
            Step::Again => continue,
        }
    }
}

/// One delivery of a key in transaction mode: what its steps share.
struct Delivery<'a> {
    idem: &'a Idem,
    spec: &'a HandlerSpec,
    mode: Mode,
    key: IdempotencyKey,
    fingerprint: Option<&'a [u8]>,
    /// The key under the handler's previous key definition, claimed first.
    previous: Option<IdempotencyKey>,
    /// The fact's time, where the handler keeps its keys by it (`event_time`).
    fact_time: Option<DateTime<Utc>>,
    /// The fact's time where the previous definition's key is kept by it too
    /// (`previous_event_time`); `None`: the previous key is in the status table.
    previous_time: Option<DateTime<Utc>>,
}

/// What a step of a delivery leaves to do.
enum Step<V, T, E> {
    /// Go on to the next step with `V`.
    Go(V),
    /// The delivery's answer.
    Done(Result<Outcome<T>, Error<E>>),
    /// A transient failure was rolled back and a retry is left: claim again.
    Again,
}

impl Delivery<'_> {
    /// A duplicate answered before the claim: from the Redis cache, or, while duplicates
    /// are frequent in the scope, from a plain read of the key's row (no lock, no write).
    /// `None`: the claim decides.
    async fn answer_without_claim<T, E, C: ResultCodec<T>>(
        &self,
        codec: &C,
    ) -> Option<Result<Outcome<T>, Error<E>>> {
        let Delivery {
            idem,
            spec,
            key,
            fingerprint,
            ..
        } = *self;
        // A key cached as succeeded is a duplicate without a word to PostgreSQL.
        if let Some(duplicate) = idem
            .cached(spec.cache, spec.scope, key, fingerprint, codec)
            .await
        {
            return Some(Ok(duplicate));
        }
        // While duplicates are frequent in the scope, a plain read answers them without the
        // claim's transaction; a key without a final row goes on to the claim.
        let rates = idem.duplicate_rates();
        if !rates.read_first(spec.scope) {
            return None;
        }
        let read = async {
            let mut conn = idem.pool().acquire().await?;
            idem.statements()
                .read(&mut conn, spec.scope, key.as_uuid(), self.fact_time)
                .await
        };
        match read.await {
            Ok(Some(existing)) if matches!(existing.status, Status::Success | Status::Parked) => {
                rates.observe(spec.scope, true);
                if mismatched(fingerprint, &existing) {
                    return Some(Err(Error::PayloadMismatch { key }));
                }
                idem.cache_existing(spec.cache, spec.scope, key, &existing)
                    .await;
                Some(decide(key, existing, codec))
            }
            // A new key, or one still being worked on: the claim decides (and counts the
            // delivery). An error is met again by the claim, which tells what it means.
            Ok(_) | Err(_) => None,
        }
    }

    fn max_attempts(&self) -> u32 {
        self.spec
            .max_attempts
            .unwrap_or(self.idem.config().max_attempts())
    }
}
