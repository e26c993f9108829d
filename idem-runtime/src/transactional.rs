//! The transactional protocol: claim, run and mark a key in the handler's own transaction.
//!
//! One transaction per delivery:
//!
//! 1. `BEGIN`;
//! 2. claim: one call of `idem_claim` (a PL/pgSQL function, migrations 0002 and 0004, so
//!    its statements' plans are cached per session): `INSERT ... ON CONFLICT DO NOTHING` of
//!    the key as `success`, a takeover of a `failed` key, or else a plain read of the row
//!    in the way. A concurrent claim of the same key waits inside its `INSERT` until this
//!    transaction ends, at most the configured lock timeout;
//! 3. the body, on the same connection;
//! 4. the result, where there is one to store (`UPDATE` of the row claimed in step 2);
//! 5. `COMMIT`: the business effects and the key's `success` become visible together.
//!
//! A row found in step 2 decides without running the body: `success` is a duplicate
//! (its stored result is replayed; no lock, no write), `parked` is refused, `failed` is
//! taken over (with a row lock) inside the claim. When the body fails, the transaction rolls
//! back and the failure is recorded by a statement of its own that never overwrites a
//! `success` written meanwhile: the happy path pays nothing for the failure path.

use std::future::Future;
use std::time::Duration;

use sqlx::{Executor, PgConnection, Postgres, Transaction};

use crate::Idem;
use crate::cache;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::IdempotencyKey;
use crate::outcome::{Error, HandlerError, Outcome, error_chain, is_transient};
use crate::store::{Claim, Existing, Status};

/// Runs `body` at most once to success for `key` in `spec.scope`, in one transaction with
/// the claim of the key. This is what `#[idempotent]` generates a call of.
///
/// `fingerprint`, where given, is compared with the one recorded with the key: a
/// different one is [`Error::PayloadMismatch`]. `codec` stores the body's value for
/// replay to duplicates.
///
/// `body` receives the open transaction and hands it back with its result; it must not
/// commit or roll it back. It may run more than once when PostgreSQL reports a
/// serialization failure or a deadlock: each earlier run was rolled back as a whole.
///
/// ```no_run
/// use idem_runtime::{Idem, Outcome, handler::{HandlerSpec, NoResult}, key::KeyBuilder};
///
/// # async fn deliver(idem: &Idem, order_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// const SPEC: HandlerSpec = HandlerSpec::new("shipping::ship_order");
/// let key = KeyBuilder::new().part("order_id", order_id)?.finish();
/// let outcome = idem_runtime::transactional::run(idem, &SPEC, key, None, NoResult, |mut tx| async move {
///     let result = sqlx::query("UPDATE orders SET shipped = true WHERE id = $1")
///         .bind(order_id)
///         .execute(&mut *tx)
///         .await
///         .map(|_| ());
///     (tx, result)
/// })
/// .await?;
/// assert!(matches!(outcome, Outcome::Executed(()) | Outcome::Duplicate(None)));
/// # Ok(()) }
/// ```
pub async fn run<T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    key: IdempotencyKey,
    fingerprint: Option<[u8; 32]>,
    codec: C,
    mut body: F,
) -> Result<Outcome<T>, Error<E>>
where
    C: ResultCodec<T>,
    E: HandlerError,
    F: FnMut(Transaction<'static, Postgres>) -> Fut,
    Fut: Future<Output = (Transaction<'static, Postgres>, Result<T, E>)>,
{
    let statements = idem.statements();
    let cache_policy = spec.cache;
    let scope = spec.scope;
    let uuid = key.as_uuid();
    let fingerprint = fingerprint.as_ref().map(<[u8; 32]>::as_slice);
    let max_attempts = spec.max_attempts.unwrap_or(idem.config().max_attempts());
    let mut retries = Retries::new(idem.config().transient_retries());
    // A key cached as succeeded is a duplicate without a word to PostgreSQL.
    if let Some(duplicate) =
        cache::lookup(idem, cache_policy, scope, key, fingerprint, &codec).await
    {
        return Ok(duplicate);
    }

    loop {
        let mut tx = idem.pool().begin().await?;
        match claim(idem, &mut tx, scope, key, fingerprint).await {
            Ok(Claimed::Owned) => {}
            Ok(Claimed::Found(existing)) => {
                // Read-only so far: dropping the transaction rolls it back on release.
                drop(tx);
                cache::remember_existing(idem, cache_policy, scope, key, &existing).await;
                return decide(key, existing, &codec);
            }
            Ok(Claimed::Mismatch) => return Err(Error::PayloadMismatch { key }),
            Err(error) if is_lock_timeout(&error) => {
                return Err(Error::InProgress { key });
            }
            Err(error) if retries.take(&error).await => continue,
            Err(error) => return Err(Error::Database(error)),
        }

        let (tx, result) = body(tx).await;
        match result {
            Ok(value) => {
                let stored = codec.encode(&value).map_err(Error::ResultEncoding)?;
                match commit(idem, tx, scope, key, stored.as_ref()).await {
                    Ok(()) => {
                        cache::remember(
                            idem,
                            cache_policy,
                            scope,
                            key,
                            fingerprint,
                            stored.as_ref(),
                        )
                        .await;
                        return Ok(Outcome::Executed(value));
                    }
                    Err(error) if retries.take(&error).await => continue,
                    Err(error) => return Err(Error::Database(error)),
                }
            }
            Err(error) => {
                // The business effects and the claim go; the failure is recorded below.
                tx.rollback().await.ok();
                if is_transient(error.as_std_error()) && retries.wait().await {
                    continue;
                }
                let text = error_chain(error.as_std_error());
                let mut conn = idem.pool().acquire().await?;
                let recorded = statements
                    .record_failure(&mut conn, scope, uuid, fingerprint, &text, max_attempts)
                    .await;
                let (attempts, parked) = match recorded {
                    Ok(Some(recorded)) => recorded,
                    Ok(None) => (0, false),
                    Err(record_error) => {
                        tracing::warn!(%key, scope, error = %record_error, "could not record a handler failure");
                        (0, false)
                    }
                };
                tracing::debug!(%key, scope, attempts, parked, error = %text, "handler failed");
                return Err(Error::Handler {
                    source: error,
                    attempts,
                    parked,
                });
            }
        }
    }
}

/// What the claim found.
enum Claimed {
    /// This transaction holds the key: run the body.
    Owned,
    /// The key's existing row decides the delivery.
    Found(Existing),
    /// The key was recorded with another payload fingerprint.
    Mismatch,
}

async fn claim(
    idem: &Idem,
    conn: &mut PgConnection,
    scope: &str,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
) -> Result<Claimed, sqlx::Error> {
    let claim = idem
        .statements()
        .claim(conn, scope, key.as_uuid(), fingerprint)
        .await?;
    Ok(match claim {
        Claim::Won => Claimed::Owned,
        Claim::Existing(existing) => {
            let mismatch = matches!((fingerprint, &existing.fingerprint), (Some(ours), Some(theirs)) if ours != theirs.as_slice());
            if mismatch {
                Claimed::Mismatch
            } else {
                Claimed::Found(existing)
            }
        }
    })
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

async fn commit(
    idem: &Idem,
    tx: Transaction<'static, Postgres>,
    scope: &str,
    key: IdempotencyKey,
    stored: Option<&serde_json::Value>,
) -> Result<(), sqlx::Error> {
    match stored {
        Some(result) => {
            let store = idem
                .statements()
                .store_result_inline(scope, key.as_uuid(), result);
            commit_checked(tx, &store).await
        }
        None => commit_checked(tx, "SELECT 1").await,
    }
}

/// Commits in one round trip, and fails if the body left the transaction aborted.
///
/// PostgreSQL answers `COMMIT` in an aborted transaction (a body that swallowed a failed
/// statement and returned `Ok`) with a rollback and no error, which would lose the claim
/// and the effects behind an `Outcome::Executed`. So the commit goes out as one simple
/// query, `<first>; COMMIT; BEGIN`: `first` fails in an aborted transaction and stops the
/// rest. The trailing `BEGIN` opens an empty transaction for the `Transaction` guard,
/// which rolls it back when dropped, in the same round trip as the connection's release.
pub(crate) async fn commit_checked(
    mut tx: Transaction<'static, Postgres>,
    first: &str,
) -> Result<(), sqlx::Error> {
    let statements = format!("{first}; COMMIT; BEGIN");
    let conn: &mut PgConnection = &mut tx;
    conn.execute(statements.as_str()).await?;
    drop(tx);
    Ok(())
}

fn is_lock_timeout(error: &sqlx::Error) -> bool {
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
