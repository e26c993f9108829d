//! The claim of a delivery's key, and the decision that a row in the way makes.

use sqlx::PgConnection;

use super::{Delivery, Retries, Step, failure::is_lock_timeout};
use crate::Idem;
use crate::handler::ResultCodec;
use crate::key::IdempotencyKey;
use crate::key_transaction::KeyTransaction;
use crate::outcome::{Error, Outcome};
use crate::store::{Claim, ClaimedKey, Existing, Status};
use crate::telemetry::Timer;

impl Delivery<'_> {
    /// Opens the transaction and claims the key in it: the transaction and its id when
    /// this delivery owns the key, or the answer that the row in the way decides.
    pub(super) async fn claim<T, E, C: ResultCodec<T>>(
        &self,
        codec: &C,
        body_lock_timeout: &str,
        retries: &mut Retries,
    ) -> Step<(KeyTransaction, i64), T, E> {
        let Delivery {
            idem,
            spec,
            mode,
            key,
            fingerprint,
        } = *self;
        let scope = spec.scope;
        let rates = idem.duplicate_rates();
        let claiming = Timer::start();
        let mut tx = match idem.key_transaction().await {
            Ok(tx) => tx,
            Err(error) => return Step::Done(Err(Error::Database(error))),
        };
        let claimed = claim(idem, &mut tx, scope, key, fingerprint, body_lock_timeout).await;
        claiming.claim(scope, mode);
        match &claimed {
            Ok(Claimed::Owned { .. }) => rates.observe(scope, false),
            Ok(Claimed::Found(existing)) => {
                rates.observe(scope, existing.status != Status::Processing);
            }
            _ => {}
        }
        match claimed {
            Ok(Claimed::Owned { xid }) => Step::Go((tx, xid)),
            Ok(Claimed::Found(existing)) => {
                // Read-only so far: dropping the transaction rolls it back before its
                // connection is reused, without the caller waiting for it.
                drop(tx);
                idem.cache_existing(spec.cache, scope, key, &existing).await;
                Step::Done(decide(key, existing, codec))
            }
            Ok(Claimed::Mismatch) => Step::Done(Err(Error::PayloadMismatch { key })),
            Ok(Claimed::Contended) => Step::Done(Err(Error::InProgress { key })),
            Err(error) if is_lock_timeout(&error) => Step::Done(Err(Error::InProgress { key })),
            Err(error) if retries.take(&error).await => Step::Again,
            Err(error) => Step::Done(Err(Error::Database(error))),
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
