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
//! [`Error::TransactionEnded`] and its key is parked (in a batch, every key of the batch: nothing of it runs again). A lost or
//! killed connection, a server shutdown, a lock timeout is not the message's fault and
//! counts no attempt, in the body or at the commit; a serialization failure or deadlock is
//! run again a few times, and counts once it persists.

use std::future::Future;
use std::time::Duration;

use sqlx::PgConnection;
use tracing::Instrument;

use crate::Idem;
use crate::config::ErrorTexts;
use crate::error_text::{error_kind, failure_text, is_transient, storable_text};
use crate::faults::{self, BackendKill};
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::IdempotencyKey;
use crate::key_transaction::KeyTransaction;
use crate::key_transaction::is_no_transaction;
use crate::outcome::{Error, HandlerError, Outcome};
use crate::scope;
use crate::store::{Claim, ClaimedKey, Existing, Status};
use crate::telemetry::{self, Mode, Timer};

/// Runs `body` at most once to success for `key` in `spec.scope`, in one transaction with
/// the claim of the key. This is what `#[idempotent]` generates a call of.
///
/// `fingerprint`, where given, is compared with the one recorded with the key: a
/// different one is [`Error::PayloadMismatch`]. `codec` stores the body's value for
/// replay to duplicates.
///
/// `body` receives the open transaction and hands it back with its result; it must not
/// commit or roll it back, nor begin a transaction of its own on it (see
/// `KeyTransaction`). It may run more than once when PostgreSQL reports a
/// serialization failure or a deadlock: each earlier run was rolled back as a whole.
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
    F: FnMut(KeyTransaction) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let identity = scope::handler_identity::<F>();
    let span = telemetry::span(spec.scope, key, Mode::Transaction);
    let result = async {
        idem.check_scope(spec, identity).await?;
        run_checked(idem, spec, Mode::Transaction, key, fingerprint, codec, body).await
    }
    .instrument(span.clone())
    .await;
    telemetry::finish(&span, spec.scope, Mode::Transaction, &result);
    result
}

/// [`run`] for a handler whose scope is checked already (the batch path's one-by-one pass).
pub(crate) async fn run_checked<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    mode: Mode,
    key: IdempotencyKey,
    fingerprint: Option<[u8; 32]>,
    codec: C,
    mut body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnMut(KeyTransaction) -> Fut,
    Fut: Future<Output = (KeyTransaction, Result<T, E>)>,
{
    let cache_policy = spec.cache;
    let scope = spec.scope;
    let uuid = key.as_uuid();
    let fingerprint = fingerprint.as_ref().map(<[u8; 32]>::as_slice);
    let mut retries = Retries::new(idem.config().transient_retries());
    // A key cached as succeeded is a duplicate without a word to PostgreSQL.
    if let Some(duplicate) = idem
        .cached(cache_policy, scope, key, fingerprint, &codec)
        .await
    {
        return Ok(duplicate);
    }
    // While duplicates are frequent in the scope, a plain read answers them without the
    // claim's transaction; a key without a final row goes on to the claim.
    let rates = idem.duplicate_rates();
    if rates.read_first(scope) {
        let read = async {
            let mut conn = idem.pool().acquire().await?;
            idem.statements().read(&mut conn, scope, uuid).await
        };
        match read.await {
            Ok(Some(existing)) if matches!(existing.status, Status::Success | Status::Parked) => {
                rates.observe(scope, true);
                if mismatched(fingerprint, &existing) {
                    return Err(Error::PayloadMismatch { key });
                }
                idem.cache_existing(cache_policy, scope, key, &existing)
                    .await;
                return decide(key, existing, &codec);
            }
            // A new key, or one still being worked on: the claim decides (and counts the
            // delivery). An error is met again by the claim, which tells what it means.
            Ok(_) | Err(_) => {}
        }
    }
    // Other deliveries of the key in this process go first, without a connection held.
    let Some(_turn) = idem
        .in_flight()
        .wait(scope, uuid, idem.config().lock_timeout())
        .await
    else {
        return Err(Error::InProgress { key });
    };

    // Read (once per handle) before a connection is held for the transaction.
    let body_lock_timeout = idem.session_lock_timeout().await?;

    loop {
        let claiming = Timer::start();
        let mut tx = idem.key_transaction().await?;
        let claimed = claim(idem, &mut tx, scope, key, fingerprint, body_lock_timeout).await;
        claiming.claim(scope, mode);
        match &claimed {
            Ok(Claimed::Owned { .. }) => rates.observe(scope, false),
            Ok(Claimed::Found(existing)) => {
                rates.observe(scope, existing.status != Status::Processing);
            }
            _ => {}
        }
        let xid = match claimed {
            Ok(Claimed::Owned { xid }) => xid,
            Ok(Claimed::Found(existing)) => {
                // Read-only so far: dropping the transaction rolls it back before its
                // connection is reused, without the caller waiting for it.
                drop(tx);
                idem.cache_existing(cache_policy, scope, key, &existing)
                    .await;
                return decide(key, existing, &codec);
            }
            Ok(Claimed::Mismatch) => return Err(Error::PayloadMismatch { key }),
            Ok(Claimed::Contended) => return Err(Error::InProgress { key }),
            Err(error) if is_lock_timeout(&error) => {
                return Err(Error::InProgress { key });
            }
            Err(error) if retries.take(&error).await => continue,
            Err(error) => return Err(Error::Database(error)),
        };

        // Tests only: a fault armed on the handle (a no-op without the feature `testing`).
        let mut kill = BackendKill::at_claim(idem.faults(), idem.pool(), &mut tx).await;
        let running = Timer::start();
        let (tx, result) = kill.during_body(body(tx)).await;
        running.handler(scope, mode);
        let failure = match result {
            Ok(value) => {
                let stored = codec.encode(&value).map_err(Error::ResultEncoding)?;
                let commit = idem.statements().commit(scope, uuid, stored.as_ref());
                if let Some(lost) = faults::before_commit(idem.faults()) {
                    let _ = tx.rollback().await;
                    return Err(Error::Database(lost));
                }
                let committed = kill.during_commit(tx.commit(&commit)).await;
                match committed {
                    Ok(()) => {
                        idem.cache_success(cache_policy, scope, key, fingerprint, stored.as_ref())
                            .await;
                        return Ok(Outcome::Executed(value));
                    }
                    Err(error) if retries.take(&error).await => continue,
                    Err(error) if ended_by_body(&error) => {
                        park_ended(idem, spec, &[(key, fingerprint)], xid).await;
                        return Err(Error::TransactionEnded { key });
                    }
                    Err(error) if counts_as_attempt(&error) => {
                        // Reported by the server about this transaction (an aborted
                        // transaction, a deferred constraint): an attempt like a handler
                        // error, so that a message that can never commit is parked.
                        let text = match idem.config().error_texts() {
                            ErrorTexts::Full => storable_text(&format!("commit failed: {error}")),
                            _ => error_kind("commit failed", &error),
                        };
                        let recorded = record_failure(
                            idem,
                            spec,
                            key,
                            fingerprint,
                            &text,
                            max_attempts(idem, spec),
                        )
                        .await;
                        // The attempt that parks the key says so: dead-letter it now.
                        return Err(match recorded {
                            Some((attempts, true)) => Error::Parked {
                                key,
                                attempts,
                                last_error: text,
                            },
                            _ => Error::Database(error),
                        });
                    }
                    Err(error) => return Err(Error::Database(error)),
                }
            }
            Err(error) => {
                // The business effects and the claim go; the failure is recorded below. A
                // rollback that cannot reach the server tells of a lost connection, whatever
                // the handler made of the error it got.
                let connection_lost =
                    matches!(tx.rollback().await, Err(ref lost) if !counts_as_attempt(lost));
                if is_transient(error.as_std_error()) && retries.wait().await {
                    continue;
                }
                if connection_lost || !counts_as_attempt_of(error.as_std_error()) {
                    // A lost connection, a server going away, a lock timeout: not the
                    // message's fault. Nothing is recorded; the next delivery retries.
                    tracing::debug!(%key, scope, "handler failed for a reason that is not the message's; no attempt counted");
                    return Err(Error::Handler {
                        source: error,
                        attempts: 0,
                        parked: false,
                    });
                }
                error
            }
        };
        let text = failure_text(&failure, idem.config().error_texts());
        let (attempts, parked) = record_failure(
            idem,
            spec,
            key,
            fingerprint,
            &text,
            max_attempts(idem, spec),
        )
        .await
        .unwrap_or((0, false));
        tracing::debug!(%key, scope, attempts, parked, error = %text, "handler failed");
        return Err(Error::Handler {
            source: failure,
            attempts,
            parked,
        });
    }
}

fn max_attempts(idem: &Idem, spec: &HandlerSpec) -> u32 {
    spec.max_attempts.unwrap_or(idem.config().max_attempts())
}

/// Records a failed attempt of `key` in a short transaction of its own (its lock waits
/// bounded by the lock timeout): the attempts and whether the key is now parked, or
/// `None` when it could not be recorded or another delivery finished the key meanwhile.
pub(crate) async fn record_failure(
    idem: &Idem,
    spec: &HandlerSpec,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
    text: &str,
    max_attempts: u32,
) -> Option<(u32, bool)> {
    let recorded = async {
        let mut tx = idem.bounded_transaction().await?;
        let recorded = idem
            .statements()
            .record_failure(
                &mut tx,
                spec.scope,
                key.as_uuid(),
                fingerprint,
                text,
                max_attempts,
            )
            .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(recorded)
    };
    match recorded.await {
        Ok(recorded) => recorded,
        Err(error) => {
            tracing::warn!(%key, scope = spec.scope, %error, "could not record a handler failure");
            None
        }
    }
}

/// What the claim found.
enum Claimed {
    /// This transaction holds the key: run the body. `xid` is the transaction's id.
    Owned { xid: i64 },
    /// The key's existing row decides the delivery.
    Found(Existing),
    /// The key was recorded with another payload fingerprint.
    Mismatch,
    /// The row kept changing under the claim: another delivery is working on it.
    Contended,
}

/// Claims the key: inserts it (the common case, one statement), or takes over a `failed`
/// key with the same payload, or reads the row that decides the delivery.
async fn claim(
    idem: &Idem,
    conn: &mut PgConnection,
    scope: &str,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
    body_lock_timeout: &str,
) -> Result<Claimed, sqlx::Error> {
    let statements = idem.statements();
    let claimed = ClaimedKey {
        scope,
        key: key.as_uuid(),
        fingerprint,
        body_lock_timeout,
    };
    let mut claim = statements.claim(conn, claimed).await?;
    // Each turn reads with a new snapshot; a row that keeps changing under it belongs to
    // deliveries that are still working on the key.
    for _ in 0..4 {
        match claim {
            Claim::Won { xid } => return Ok(Claimed::Owned { xid }),
            Claim::Existing(existing) if mismatched(fingerprint, &existing) => {
                return Ok(Claimed::Mismatch);
            }
            Claim::Existing(existing) if existing.status != Status::Failed => {
                return Ok(Claimed::Found(existing));
            }
            // Failed (take it over), or committed or purged while the claim waited.
            Claim::Existing(_) | Claim::Again => {
                claim = statements.takeover(conn, claimed).await?;
                if let Claim::Again = claim {
                    // Gone: claim it afresh.
                    claim = statements.claim(conn, claimed).await?;
                }
            }
        }
    }
    Ok(Claimed::Contended)
}

/// Whether the payload fingerprints of a delivery and of the key's row differ.
pub(crate) fn mismatched(ours: Option<&[u8]>, existing: &Existing) -> bool {
    crate::key::fingerprints_differ(ours, existing.fingerprint.as_deref())
}

pub(crate) fn decide<T, E, C: ResultCodec<T>>(
    key: IdempotencyKey,
    existing: Existing,
    codec: &C,
) -> Result<Outcome<T>, Error<E>> {
    match existing.status {
        Status::Success => codec
            .decode(existing.result)
            .map(Outcome::Duplicate)
            .map_err(|source| Error::StoredResult { key, source }),
        Status::Parked => Err(Error::Parked {
            key,
            attempts: existing.attempts,
            last_error: existing.last_error.unwrap_or_default(),
        }),
        Status::Processing | Status::Failed => Err(Error::InProgress { key }),
    }
}

/// Whether a failure counts as an attempt of the message: a refusal by PostgreSQL of
/// what the transaction holds (a constraint, an aborted transaction, a value it cannot
/// store, a statement timeout), a serialization failure or deadlock that persisted through
/// the retries, or the handler's own error. Not: a lost or killed connection, a server
/// shutting down or out of resources, a lock timeout, a pool or I/O error (SQLSTATE
/// classes 08, 53, 57 but 57014, 58, and 55P03), nor a prepared statement that the
/// session does not have or already has (26000, 42P05: a pooler that gave the session's
/// transaction to another server connection), which say nothing about the message.
pub(crate) fn counts_as_attempt(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            let class = code.get(..2).unwrap_or("");
            !(matches!(class, "08" | "53" | "58" | "")
                || (class == "57" && code != "57014")
                || matches!(code, "55P03" | "26000" | "42P05"))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => false,
        _ => true,
    }
}

/// [`counts_as_attempt`] for a handler's error: decided by the first database error among
/// its sources, if any; the handler's own errors count.
pub(crate) fn counts_as_attempt_of(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(sqlx_error) = error.downcast_ref::<sqlx::Error>() {
            return counts_as_attempt(sqlx_error);
        }
        current = error.source();
    }
    true
}

/// Parks the keys of a transaction that a body ended itself (`COMMIT` or `ROLLBACK`): a
/// key whose row that transaction committed is set from `success` to `parked`; a key that
/// it did not commit is recorded `parked`. Its effects may be partly committed: nothing
/// of it runs again until an operator looks and resets the key.
pub(crate) async fn park_ended(
    idem: &Idem,
    spec: &HandlerSpec,
    keys: &[(IdempotencyKey, Option<&[u8]>)],
    xid: i64,
) {
    const TEXT: &str = "the handler's body ended the transaction that held its key (COMMIT or ROLLBACK in the body, or begin() on its connection); its effects may be partly committed";
    for &(key, fingerprint) in keys {
        let parked = async {
            let mut tx = idem.bounded_transaction().await?;
            let parked = idem
                .statements()
                .park_committed(&mut tx, spec.scope, key.as_uuid(), xid, TEXT)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(parked)
        }
        .await;
        match parked {
            Ok(true) => {}
            Ok(false) => {
                record_failure(idem, spec, key, fingerprint, TEXT, 1).await;
            }
            Err(error) => {
                tracing::warn!(%key, scope = spec.scope, %error, "could not park a key whose transaction the body ended");
            }
        }
    }
}

/// Whether the commit's check found no transaction open: the body ended the claim's
/// transaction itself (SQLSTATE 25P01 from the check, see [`Statements::commit`]).
///
/// [`Statements::commit`]: crate::store::Statements::commit
pub(crate) fn ended_by_body(error: &sqlx::Error) -> bool {
    is_no_transaction(error)
}

pub(crate) fn is_lock_timeout(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("55P03"))
}

/// The bounded retries of transactions that hit a serialization failure or a deadlock.
struct Retries {
    left: u32,
    backoff: Duration,
}

impl Retries {
    fn new(limit: u32) -> Self {
        Retries {
            left: limit,
            backoff: Duration::from_millis(5),
        }
    }

    /// Whether `error` is transient and a retry is left (after a short back-off).
    async fn take(&mut self, error: &sqlx::Error) -> bool {
        is_transient(error) && self.wait().await
    }

    async fn wait(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        tokio::time::sleep(self.backoff).await;
        self.backoff *= 2;
        true
    }
}
