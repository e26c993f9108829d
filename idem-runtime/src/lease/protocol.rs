//! The lease protocol: claim, run, mark (see the [module docs](super)).

use std::future::Future;
use std::time::Duration;

use tracing::Instrument;
use uuid::Uuid;

use super::Lease;
use crate::Idem;
use crate::error_text::failure_text;
use crate::faults;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::IdempotencyKey;
use crate::outcome::{Error, HandlerError, Outcome};
use crate::scope;
use crate::store::LeaseClaim;
use crate::telemetry::{self, Mode, Timer};
use crate::transactional;

/// Runs `body` under a lease on `key` in `spec.scope`: at most one worker at a time, at
/// most once to success. This is what `#[idempotent(mode = "lease")]` generates a call of.
pub async fn run<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    key: IdempotencyKey,
    fingerprint: Option<[u8; 32]>,
    codec: C,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let span = telemetry::span(spec.scope, key, Mode::Lease);
    let result = run_inner(idem, spec, key, fingerprint, codec, body)
        .instrument(span.clone())
        .await;
    telemetry::finish(&span, spec.scope, Mode::Lease, &result);
    result
}

/// [`run`] without its span and outcome count.
async fn run_inner<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    key: IdempotencyKey,
    fingerprint: Option<[u8; 32]>,
    codec: C,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let identity = scope::handler_identity::<F>();
    idem.check_scope(spec, identity).await?;
    let statements = idem.statements();
    let cache_policy = spec.cache;
    let lease = spec.lease_or_default();
    let scope = spec.scope;
    let uuid = key.as_uuid();
    let fingerprint = fingerprint.as_ref().map(<[u8; 32]>::as_slice);
    let max_attempts = spec.max_attempts.unwrap_or(idem.config().max_attempts());
    let token = Uuid::new_v4();
    // A key cached as succeeded is a duplicate without a word to PostgreSQL.
    if let Some(duplicate) = idem
        .cached(cache_policy, scope, key, fingerprint, &codec)
        .await
    {
        return Ok(duplicate);
    }

    // A duplicate, a parked key or a live lease decides by a plain read (no lock).
    let mut conn = idem.pool().acquire().await?;
    if let Some(existing) = statements.settled_lease(&mut conn, scope, uuid).await? {
        drop(conn);
        return settled(idem, spec, key, fingerprint, existing, &codec).await;
    }
    drop(conn);
    // Every lease statement that writes runs in a short transaction whose lock waits are
    // bounded.
    let claiming = Timer::start();
    let mut tx = idem.bounded_transaction().await?;
    let claimed = statements
        .claim_lease(
            &mut tx,
            scope,
            uuid,
            fingerprint,
            token,
            lease,
            max_attempts,
        )
        .await;
    claiming.claim(scope, Mode::Lease);
    let attempt = match claimed {
        Ok(LeaseClaim::Won { attempt }) => {
            tx.commit().await?;
            // Tests only: a worker that vanishes holding the lease (a no-op without the
            // feature `testing`).
            if let Some(lost) = faults::after_lease_claim(idem.faults()) {
                return Err(Error::Database(lost));
            }
            attempt
        }
        Ok(LeaseClaim::Existing(existing)) => {
            tx.commit().await?;
            return settled(idem, spec, key, fingerprint, existing, &codec).await;
        }
        Err(error) if transactional::is_lock_timeout(&error) => {
            return Err(Error::InProgress { key });
        }
        Err(error) => return Err(Error::Database(error)),
    };

    let guard = Lease::new(idem.clone(), scope, key, token, attempt);
    let running = Timer::start();
    let result = body(guard).await;
    running.handler(scope, Mode::Lease);

    let (text, failure) = match result {
        Ok(value) => {
            let stored = codec.encode(&value).map_err(Error::ResultEncoding)?;
            // Tests only: a worker that vanishes after its effect (a no-op without the
            // feature `testing`).
            if let Some(lost) = faults::before_lease_completion(idem.faults()) {
                return Err(Error::Database(lost));
            }
            // The effect has happened: a completion that a lost connection or the pooler
            // cut short is sent again while the lease is this worker's (at most three
            // times), rather than leaving the key to run again once the lease expires.
            let mut resent = 0;
            let completed = loop {
                let completed = async {
                    let mut tx = idem.bounded_transaction().await?;
                    let completed = statements
                        .complete_lease(&mut tx, scope, uuid, token, stored.as_ref())
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
                    completed => break completed,
                }
            };
            match completed {
                Ok(true) => {
                    idem.cache_success(cache_policy, scope, key, fingerprint, stored.as_ref())
                        .await;
                    return Ok(Outcome::Executed(value));
                }
                Ok(false) => {
                    tracing::warn!(%key, scope, "lease lost before completion; the outcome was not recorded");
                    return Err(Error::LeaseLost { key });
                }
                // Refused by the server: count it as a failed attempt, so that an effect
                // whose completion can never be recorded is repeated at most
                // `max_attempts` times, then parked. A lost connection or a pooler's error
                // is not the message's: the lease stays until it expires.
                Err(error) if transactional::counts_as_attempt(&error) => (
                    failure_text(&error, idem.config().error_texts()),
                    Err(Error::Database(error)),
                ),
                Err(error) => return Err(Error::Database(error)),
            }
        }
        Err(error) => (failure_text(&error, idem.config().error_texts()), Ok(error)),
    };
    // A body's failure that is the connection's, the pooler's or the server's (see
    // `transactional::counts_as_attempt`) gives the lease back without the attempt.
    let infrastructure =
        matches!(&failure, Ok(error) if !transactional::counts_as_attempt_of(error.as_std_error()));
    let mut tx = idem.bounded_transaction().await?;
    let recorded = if infrastructure {
        statements
            .release_lease(&mut tx, scope, uuid, token, &text)
            .await?
            .map(|(attempts, _)| (attempts, false))
    } else {
        statements
            .fail_lease(&mut tx, scope, uuid, token, &text, max_attempts)
            .await?
    };
    tx.commit().await?;
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
