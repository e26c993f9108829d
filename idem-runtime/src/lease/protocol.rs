//! The lease protocol: claim, run, mark (see the [module docs](super)).

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use tracing::Instrument;
use uuid::Uuid;

use super::Lease;
use crate::Idem;
use crate::error_text::failure_text;
use crate::faults;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::definition::KeyLayout;
use crate::key::handler_key::MessageKeys;
use crate::key::{IdempotencyKey, KeyError};
use crate::outcome::{Error, HandlerError, Outcome};
use crate::scope;
use crate::store::{Bucket, FactWindow, LeaseClaim, LeaseKey, Statements};
use crate::telemetry::{self, Mode, Timer};
use crate::transactional;

/// Runs `body` under a lease on `key` in `spec.scope`: at most one worker at a time, at
/// most once to success. This is what `#[idempotent(mode = "lease")]` generates a call of.
/// `layout` describes the handler's key for the scope's check; a lease-mode handler
/// declares no previous key (`previous_key` is refused at compile time), so only
/// `keys.key` and `keys.fingerprint` are claimed, in the status table or, with
/// `keys.fact_time` (`event_time`), in the fact's bucket of the time buckets, where a
/// fact outside its window is refused ([`Error::OutsideWindow`]) and never run.
pub async fn run_lease<T, E, C, F, Fut>(
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
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let span = telemetry::span(spec.scope, keys.key, Mode::Lease);
    let result = run_inner(idem, spec, layout, keys, codec, body)
        .instrument(span.clone())
        .await;
    telemetry::finish(&span, spec.scope, Mode::Lease, &result);
    result
}

/// [`run_lease`] without its span and outcome count: one step per stage of the [module
/// docs](super), each of which may answer the delivery (`Break`) or hand on to the next.
async fn run_inner<T, E, C, F, Fut>(
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
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let key = keys.key;
    // A handler with `event_time` whose message has no time for it: its key is not in
    // the status table either.
    if let (Some(field), None) = (layout.event_time, keys.fact_time) {
        return Err(Error::Key(KeyError::MissingValue { field }));
    }
    let identity = scope::handler_identity::<F>();
    idem.check_scope(spec, identity, layout).await?;
    let time = keys
        .fact_time
        .map(|at| transactional::fact_window(idem, spec, at));
    if let Some(time) = time.filter(|time| !transactional::representable(time.at)) {
        return Err(transactional::outside_window(key, time.at));
    }
    let delivery = LeaseDelivery {
        idem,
        spec,
        key,
        fingerprint: keys.fingerprint(),
        time,
        token: Uuid::new_v4(),
        max_attempts: spec.max_attempts.unwrap_or(idem.config().max_attempts()),
    };
    if let ControlFlow::Break(outcome) = delivery.decide_without_claim(&codec).await? {
        return Ok(outcome);
    }
    let attempt = match delivery.claim(&codec).await? {
        ControlFlow::Continue(attempt) => attempt,
        ControlFlow::Break(outcome) => return Ok(outcome),
    };
    let guard = Lease::new(idem.clone(), spec.scope, key, time, delivery.token, attempt);
    let running = Timer::start();
    let result = body(guard).await;
    running.handler(spec.scope, Mode::Lease);
    let texts = idem.config().error_texts();
    let (text, failure) = match result {
        Ok(value) => match delivery.complete(value, &codec).await? {
            ControlFlow::Break(outcome) => return Ok(outcome),
            ControlFlow::Continue(refused) => {
                (failure_text(&refused, texts), Err(Error::Database(refused)))
            }
        },
        Err(error) => (failure_text(&error, texts), Ok(error)),
    };
    delivery.record_failure(text, failure).await
}

/// One lease-mode delivery of a key: what its steps share.
struct LeaseDelivery<'a> {
    idem: &'a Idem,
    spec: &'a HandlerSpec,
    key: IdempotencyKey,
    fingerprint: Option<&'a [u8]>,
    /// The fact's time and its window, where the handler keeps its keys by it.
    time: Option<FactWindow>,
    /// This claim's owner token.
    token: Uuid,
    max_attempts: u32,
}

impl LeaseDelivery<'_> {
    /// The key's row: in the status table, or in its fact's bucket.
    fn lease_key(&self) -> LeaseKey<'_> {
        LeaseKey {
            scope: self.spec.scope,
            key: self.key.as_uuid(),
            time: self.time,
        }
    }

    /// A duplicate, a parked key or a live lease, answered from the Redis cache or by a
    /// plain read of the key's row (no lock); `Continue`: the claim decides.
    async fn decide_without_claim<T, E, C: ResultCodec<T>>(
        &self,
        codec: &C,
    ) -> Result<ControlFlow<Outcome<T>>, Error<E>> {
        let (idem, spec, key) = (self.idem, self.spec, self.key);
        // A key cached as succeeded is a duplicate without a word to PostgreSQL.
        if let Some(duplicate) = idem
            .cached(spec.cache, spec.scope, key, self.fingerprint, codec)
            .await
        {
            return Ok(ControlFlow::Break(duplicate));
        }
        let mut conn = idem.pool().acquire().await?;
        let existing = idem
            .statements()
            .settled_lease(&mut conn, self.lease_key())
            .await?;
        drop(conn);
        match existing {
            Some(existing) => settled(idem, spec, key, self.fingerprint, existing, codec)
                .await
                .map(ControlFlow::Break),
            None => Ok(ControlFlow::Continue(())),
        }
    }

    /// Claims the key under a lease, in a short transaction whose lock waits are
    /// bounded: the attempt this claim counts, or the answer of the row in the way. A
    /// fact whose bucket does not exist yet has it made, and is claimed again.
    async fn claim<T, E, C: ResultCodec<T>>(
        &self,
        codec: &C,
    ) -> Result<ControlFlow<Outcome<T>, u32>, Error<E>> {
        // The bucket made, the claim finds it; an operator detaching it by hand meanwhile
        // ends in the claim's error after a few turns.
        let mut turns = 0;
        loop {
            match self.claim_once(codec).await {
                Err(Error::Database(error))
                    if Statements::is_missing_bucket(&error) && turns < 3 =>
                {
                    turns += 1;
                    self.make_bucket(error).await?;
                }
                claimed => return claimed,
            }
        }
    }

    /// Makes the bucket of the fact, which the claim did not find (`error`).
    async fn make_bucket<E>(&self, error: sqlx::Error) -> Result<(), Error<E>> {
        let Some(time) = self.time else {
            return Err(Error::Database(error));
        };
        let idem = self.idem;
        let width = idem.config().retention().bucket_width_duration();
        match idem
            .statements()
            .make_bucket(idem.pool(), time, width)
            .await?
        {
            Bucket::Ready => Ok(()),
            Bucket::TooOld | Bucket::TooNew => {
                Err(transactional::outside_window(self.key, time.at))
            }
        }
    }

    /// One claim: see [`claim`](Self::claim).
    async fn claim_once<T, E, C: ResultCodec<T>>(
        &self,
        codec: &C,
    ) -> Result<ControlFlow<Outcome<T>, u32>, Error<E>> {
        let (idem, spec, key) = (self.idem, self.spec, self.key);
        let claiming = Timer::start();
        let mut tx = idem.bounded_transaction().await?;
        let claimed = idem
            .statements()
            .claim_lease(
                &mut tx,
                self.lease_key(),
                self.fingerprint,
                self.token,
                spec.lease_or_default(),
                self.max_attempts,
            )
            .await;
        claiming.claim(spec.scope, Mode::Lease);
        match claimed {
            Ok(LeaseClaim::Won { attempt }) => {
                tx.commit().await?;
                // Tests only: a worker that vanishes holding the lease (a no-op without the
                // feature `testing`).
                if let Some(lost) = faults::after_lease_claim(idem.faults()) {
                    return Err(Error::Database(lost));
                }
                Ok(ControlFlow::Continue(attempt))
            }
            Ok(LeaseClaim::Existing(existing)) => {
                tx.commit().await?;
                settled(idem, spec, key, self.fingerprint, existing, codec)
                    .await
                    .map(ControlFlow::Break)
            }
            Ok(LeaseClaim::Outside) => {
                tx.commit().await?;
                Err(transactional::outside_window(
                    key,
                    self.time.map(|time| time.at).unwrap_or_default(),
                ))
            }
            Err(error) if transactional::is_lock_timeout(&error) => Err(Error::InProgress { key }),
            Err(error) => Err(Error::Database(error)),
        }
    }

    /// Records the body's `value` as the key's `success` while the lease is this
    /// worker's. `Continue`: the server refused the completion, which counts as a failed
    /// attempt, so that an effect whose completion can never be recorded is repeated at
    /// most `max_attempts` times, then parked.
    async fn complete<T, E, C: ResultCodec<T>>(
        &self,
        value: T,
        codec: &C,
    ) -> Result<ControlFlow<Outcome<T>, sqlx::Error>, Error<E>> {
        let (idem, spec, key) = (self.idem, self.spec, self.key);
        let stored = codec.encode(&value).map_err(Error::ResultEncoding)?;
        // Tests only: a worker that vanishes after its effect (a no-op without the
        // feature `testing`).
        if let Some(lost) = faults::before_lease_completion(idem.faults()) {
            return Err(Error::Database(lost));
        }
        match self.send_completion(stored.as_ref()).await {
            Ok(true) => {
                idem.cache_success(
                    spec.cache,
                    spec.scope,
                    key,
                    self.fingerprint,
                    stored.as_ref(),
                )
                .await;
                Ok(ControlFlow::Break(Outcome::Executed(value)))
            }
            Ok(false) => {
                tracing::warn!(%key, scope = spec.scope, "lease lost before completion; the outcome was not recorded");
                Err(Error::LeaseLost { key })
            }
            // A lost connection or a pooler's error is not the message's: the lease stays
            // until it expires.
            Err(error) if transactional::counts_as_attempt(&error) => {
                Ok(ControlFlow::Continue(error))
            }
            Err(error) => Err(Error::Database(error)),
        }
    }

    /// Sends the completion: whether the lease was still this worker's. The effect has
    /// happened: a completion that a lost connection or the pooler cut short is sent again
    /// while the lease is this worker's (at most three times), rather than leaving the key
    /// to run again once the lease expires.
    async fn send_completion(
        &self,
        stored: Option<&serde_json::Value>,
    ) -> Result<bool, sqlx::Error> {
        let (idem, scope, key) = (self.idem, self.spec.scope, self.key);
        let mut resent = 0;
        loop {
            let completed = async {
                let mut tx = idem.bounded_transaction().await?;
                let completed = idem
                    .statements()
                    .complete_lease(&mut tx, self.lease_key(), self.token, stored)
                    .await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(completed)
            }
            .await;
            match completed {
                Err(error) if resent < 3 && !transactional::counts_as_attempt(&error) => {
                    resent += 1;
                    tracing::debug!(%key, scope, %error, "the lease's completion failed for a reason that is not the message's; sending it again");
                    tokio::time::sleep(Duration::from_millis(20 << resent)).await;
                }
                completed => return completed,
            }
        }
    }

    /// Records a failure with `text` while the lease is this worker's: the body's error
    /// (`Ok`), or a completion the server refused (`Err`). A body's failure that is the
    /// connection's, the pooler's or the server's (see
    /// `transactional::counts_as_attempt`) gives the lease back without the attempt.
    async fn record_failure<T, E: HandlerError>(
        &self,
        text: String,
        failure: Result<E, Error<E>>,
    ) -> Result<Outcome<T>, Error<E>> {
        let (idem, scope, key) = (self.idem, self.spec.scope, self.key);
        let statements = idem.statements();
        let infrastructure = matches!(&failure, Ok(error) if !transactional::counts_as_attempt_of(error.as_std_error()));
        let mut tx = idem.bounded_transaction().await?;
        let recorded = if infrastructure {
            statements
                .release_lease(&mut tx, self.lease_key(), self.token, &text)
                .await?
                .map(|(attempts, _)| (attempts, false))
        } else {
            statements
                .fail_lease(
                    &mut tx,
                    self.lease_key(),
                    self.token,
                    &text,
                    self.max_attempts,
                )
                .await?
        };
        tx.commit().await?;
        if recorded.is_some() && !infrastructure {
            crate::telemetry::attempt_charged(scope);
        }
        match (recorded, failure) {
            (Some((attempts, parked)), Ok(source)) => Err(Error::Handler {
                source,
                attempts,
                parked,
            }),
            (Some((attempts, true)), Err(_)) => Err(Error::Parked {
                key,
                attempts,
                last_error: text,
            }),
            (Some(_), Err(error)) => Err(error),
            (None, _) => {
                tracing::warn!(%key, scope, error = %text, "lease lost before the failure was recorded");
                Err(Error::LeaseLost { key })
            }
        }
    }
}

/// The outcome of a delivery whose key's row decided it without a claim.
async fn settled<T, E, C: ResultCodec<T>>(
    idem: &Idem,
    spec: &HandlerSpec,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
    existing: crate::store::Existing,
    codec: &C,
) -> Result<Outcome<T>, Error<E>> {
    if transactional::mismatched(fingerprint, &existing) {
        return Err(Error::PayloadMismatch { key });
    }
    idem.cache_existing(spec.cache, spec.scope, key, &existing)
        .await;
    transactional::decide(key, existing, codec)
}
