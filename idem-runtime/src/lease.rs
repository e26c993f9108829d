//! Lease mode: idempotent handlers whose effect is outside the database.
//!
//! A handler that calls a payment provider or sends an e-mail cannot run inside the
//! database transaction that marks its key: the effect cannot be rolled back. In lease
//! mode the key is claimed on its own, with a lease:
//!
//! 1. claim: the key becomes `processing` with an owner token and an expiry computed by
//!    PostgreSQL (`now() + lease`), committed at once. A `failed` key, or a `processing`
//!    key whose lease expired (its worker crashed), can be claimed again;
//! 2. the body runs with a [`Lease`]: it carries the owner token (a fencing token to
//!    hand to the external system) and can [`extend`](Lease::extend) the lease;
//! 3. mark: `success` (with the result), or `failed` (with the error text), only where
//!    the lease is still this worker's. A worker whose lease was taken over gets
//!    [`Error::LeaseLost`] and its outcome is not recorded.
//!
//! A duplicate that arrives during a live lease gets [`Error::InProgress`]; after
//! `success` it is a duplicate and the body does not run.
//!
//! **The guarantee is at-least-once, deduplicated.** A worker that crashes after the
//! effect but before the mark leaves a lease that expires; the next delivery then runs
//! the effect again. So does a stalled worker whose lease ran out and was taken over: its
//! mark is refused with [`Error::LeaseLost`], but its effect has happened. Let the
//! external system absorb the repeat: pass it [`Lease::key`], the same for every attempt,
//! as its idempotency key, and [`Lease::token`], new for each claim, to tell the claims
//! apart (where it needs an ordered fencing token, [`Lease::attempt`] grows with each
//! claim of the key, until the key is reset).
//!
//! Expiries are computed and compared on the database's clock only: every lease statement
//! uses PostgreSQL's `now()` and none binds a timestamp, so the workers' clocks may drift.
//! Choose a lease longer than the body usually takes, and [`extend`](Lease::extend) it
//! from long bodies: once a lease runs out, another worker may run the effect as well.
//!
//! # Choosing a mode
//!
//! - **Transaction mode** (the default) when the handler's effects are writes to the
//!   PostgreSQL database that holds the status table: the effects and the key's `success`
//!   commit together, so they happen exactly once, and a crash leaves nothing behind.
//! - **Lease mode** (`mode = "lease"`) when the effect is elsewhere: an HTTP call, an
//!   e-mail, a message to a broker, a write to another database. No transaction covers it;
//!   the lease lets one worker at a time run the body, and none after a success, and the
//!   effect is at-least-once, deduplicated by the key and the fencing token.
//! - Both: split the work into two handlers, or write the external call as an outbox row
//!   in transaction mode and make the call from a lease-mode handler of the outbox.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;
use uuid::Uuid;

use crate::Idem;
use crate::cache;
use crate::error_text::failure_text;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::IdempotencyKey;
use crate::outcome::{Error, HandlerError, Outcome};
use crate::scope;
use crate::store::LeaseClaim;
use crate::telemetry::{self, Mode, Timer};
use crate::transactional;

/// The lease that a lease-mode handler holds on its key while its body runs.
#[derive(Clone, Debug)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

#[derive(Debug)]
struct LeaseInner {
    idem: Idem,
    scope: &'static str,
    key: IdempotencyKey,
    token: Uuid,
    attempt: u32,
}

/// The lease is no longer held by this worker: it expired and another worker claimed
/// the key, or the key was reset.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another worker holds the key now.
    #[error("the lease on key {key} was lost: it expired and another worker claimed the key")]
    Lost {
        /// The key.
        key: IdempotencyKey,
    },
    /// PostgreSQL failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl Lease {
    /// The owner token of this claim: a random UUID, new for each claim of the key. An
    /// external system that records the token of the call it executed can tell a stale
    /// worker's call from the current one; the tokens are not ordered (see
    /// [`attempt`](Self::attempt) for a number that grows with each claim).
    pub fn token(&self) -> Uuid {
        self.inner.token
    }

    /// The key the lease is on.
    pub fn key(&self) -> IdempotencyKey {
        self.inner.key
    }

    /// Which attempt this is (1 for the first execution). It grows with each claim of
    /// the key, after a failure or an expired lease alike, until [`Idem::reset`].
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// Extends the lease to `duration` from now (the database's now). Call it before the
    /// lease runs out in long work; fails with [`LeaseError::Lost`] if the lease is gone.
    pub async fn extend(&self, duration: Duration) -> Result<(), LeaseError> {
        let inner = &self.inner;
        let mut tx = inner.idem.bounded_transaction().await?;
        let extended = inner
            .idem
            .statements()
            .extend_lease(
                &mut tx,
                inner.scope,
                inner.key.as_uuid(),
                inner.token,
                duration,
            )
            .await?;
        tx.commit().await?;
        if extended {
            Ok(())
        } else {
            Err(LeaseError::Lost { key: inner.key })
        }
    }
}

/// Runs `body` under a lease on `key` in `spec.scope`: at most one worker at a time, at
/// most once to success. This is what `#[idempotent(mode = "lease")]` generates a call of.
///
/// ```no_run
/// use std::time::Duration;
/// use idem_runtime::{Idem, handler::{HandlerSpec, JsonResult}, key::KeyBuilder};
///
/// # async fn notify(idem: &Idem, order_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// const SPEC: HandlerSpec = HandlerSpec::new("mail::send_receipt").lease(Duration::from_secs(30));
/// let key = KeyBuilder::new().part("order_id", order_id)?.finish();
/// let outcome = idem_runtime::lease::run(idem, &SPEC, key, None, JsonResult, |lease| async move {
///     // Pass lease.token() to the mail service as its idempotency key.
///     Ok::<_, std::io::Error>(format!("sent with token {}", lease.token()))
/// })
/// .await?;
/// # Ok(()) }
/// ```
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
    if let Some(duplicate) =
        cache::lookup(idem, cache_policy, scope, key, fingerprint, &codec).await
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
            // Tests only: a worker that vanishes holding the lease (the feature `testing`).
            #[cfg(feature = "testing")]
            if let Some(lost) = crate::testing::faults::after_lease_claim(idem) {
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

    let guard = Lease {
        inner: Arc::new(LeaseInner {
            idem: idem.clone(),
            scope,
            key,
            token,
            attempt,
        }),
    };
    let running = Timer::start();
    let result = body(guard).await;
    running.handler(scope, Mode::Lease);

    let (text, failure) = match result {
        Ok(value) => {
            let stored = codec.encode(&value).map_err(Error::ResultEncoding)?;
            // Tests only: a worker that vanishes after its effect (the feature `testing`).
            #[cfg(feature = "testing")]
            if let Some(lost) = crate::testing::faults::before_lease_completion(idem) {
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
                    cache::remember(idem, cache_policy, scope, key, fingerprint, stored.as_ref())
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
    cache::remember_existing(idem, spec.cache, spec.scope, key, &existing).await;
    transactional::decide(key, existing, codec)
}
