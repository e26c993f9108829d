//! The claim of a delivery's key, and the decision that a row in the way makes.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{Delivery, Retries, Step, failure::is_lock_timeout};
use crate::Idem;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::IdempotencyKey;
use crate::key_transaction::KeyTransaction;
use crate::outcome::{Error, Outcome, WindowEdge};
use crate::store::{Bucket, Claim, ClaimedKey, Existing, FactWindow, Statements, Status};
use crate::telemetry::Timer;

impl Delivery<'_> {
    /// Opens the transaction and claims the key in it: the transaction and its id when
    /// this delivery owns the key, or the answer that the row in the way decides. A key
    /// under the previous definition is claimed first, in the same transaction (see
    /// [`Delivery::claim_previous`]).
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
            previous,
            ..
        } = *self;
        let scope = spec.scope;
        let time = self.fact_window();
        if time.is_some_and(|time| !representable(time.at)) {
            return Step::Done(Err(self.outside_window()));
        }
        let rates = idem.duplicate_rates();
        let claiming = Timer::start();
        let mut tx = match idem.key_transaction().await {
            Ok(tx) => tx,
            Err(error) => return Step::Done(Err(Error::Database(error))),
        };
        if let Some(previous) = previous {
            match self.claim_previous(&mut tx, previous).await {
                Ok(None) => {}
                Ok(Some(found)) => {
                    claiming.claim(scope, mode);
                    // Read-only so far: the connection goes back before anything else.
                    drop(tx);
                    return Step::Done(self.answer_previous(found, codec).await);
                }
                Err(error) if is_lock_timeout(&error) => {
                    return Step::Done(Err(Error::InProgress { key }));
                }
                Err(error) if Statements::is_missing_bucket(&error) => {
                    // A previous key kept by the fact's time, in a bucket not made yet.
                    drop(tx);
                    return self.make_bucket(error, retries).await;
                }
                Err(error) if retries.take(&error).await => return Step::Again,
                Err(error) => return Step::Done(Err(Error::Database(error))),
            }
        }
        let claimed = claim(
            idem,
            &mut tx,
            scope,
            key,
            fingerprint,
            time,
            body_lock_timeout,
        )
        .await;
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
            Ok(Claimed::Outside) => Step::Done(Err(self.outside_window())),
            Err(error) if is_lock_timeout(&error) => Step::Done(Err(Error::InProgress { key })),
            Err(error) if Statements::is_missing_bucket(&error) => {
                // The transaction is aborted: it goes, and the claim starts again once
                // the bucket exists.
                drop(tx);
                self.make_bucket(error, retries).await
            }
            Err(error) if retries.take(&error).await => Step::Again,
            Err(error) => Step::Done(Err(Error::Database(error))),
        }
    }

    /// The fact's time with its scope's window, for a handler with `event_time`: the
    /// window a cleaner of this handle's settings gives the scope (its own, then the one
    /// the handler declares, then the default).
    fn fact_window(&self) -> Option<FactWindow> {
        self.fact_time
            .map(|at| fact_window(self.idem, self.spec, at))
    }

    /// A fact outside its window: which side, by this process's clock.
    fn outside_window<E>(&self) -> Error<E> {
        outside_window(self.key, self.fact_time.unwrap_or_default())
    }

    /// The claim met no bucket for its fact: makes it (or learns that the fact is outside
    /// its window) and claims again. A bucket that is still missing after a few turns
    /// (an operator detaching it by hand) ends in the claim's error.
    async fn make_bucket<T, E>(
        &self,
        error: sqlx::Error,
        retries: &mut Retries,
    ) -> Step<(KeyTransaction, i64), T, E> {
        let Some(time) = self.fact_window() else {
            return Step::Done(Err(Error::Database(error)));
        };
        let idem = self.idem;
        let width = idem.config().retention().bucket_width_duration();
        match idem
            .statements()
            .make_bucket(idem.pool(), time, width)
            .await
        {
            Ok(Bucket::Ready) if retries.wait().await => Step::Again,
            Ok(Bucket::Ready) => Step::Done(Err(Error::Database(error))),
            Ok(Bucket::TooOld | Bucket::TooNew) => Step::Done(Err(self.outside_window())),
            Err(made) if retries.take(&made).await => Step::Again,
            Err(made) => Step::Done(Err(Error::Database(made))),
        }
    }
}

impl Delivery<'_> {
    /// Claims the key under the handler's previous key definition, in the delivery's
    /// transaction and before its key: `None` when this transaction holds it now (inserted
    /// as `success`, or a `failed` one taken over), so that a delivery of the previous
    /// definition's build waits for this transaction and then finds the fact done; what
    /// the previous key's row says otherwise, which decides the delivery (see
    /// [`Delivery::answer_previous`]).
    ///
    /// Every delivery of the new definition claims the previous key first and the new key
    /// second, and a delivery of the old definition claims only the previous key, so no
    /// two of them wait for each other in opposite orders.
    async fn claim_previous(
        &self,
        tx: &mut KeyTransaction,
        previous: IdempotencyKey,
    ) -> Result<Option<PreviousFound>, sqlx::Error> {
        let Delivery {
            idem,
            spec,
            key,
            fingerprint,
            ..
        } = *self;
        let scope = spec.scope;
        // The lock timeout stays the claim's for the second claim.
        let claim_lock_timeout = idem.statements().claim_lock_timeout();
        // In the status table, or in the fact's bucket where the previous definition kept
        // its keys by the fact's time too (`previous_event_time`).
        let time = self.previous_time.map(|at| fact_window(idem, spec, at));
        let existing = match claim(
            idem,
            tx,
            scope,
            previous,
            fingerprint,
            time,
            claim_lock_timeout,
        )
        .await?
        {
            Claimed::Owned { .. } => return Ok(None),
            Claimed::Mismatch => return Ok(Some(PreviousFound::Mismatch)),
            Claimed::Contended => return Ok(Some(PreviousFound::Contended)),
            Claimed::Outside => return Ok(Some(PreviousFound::Outside)),
            Claimed::Found(existing) => existing,
        };
        // Whether the fact succeeded under the previous definition alone (no row of its
        // own key, in its own table), on the same connection.
        let alone = existing.status == Status::Success
            && idem
                .statements()
                .read(tx, scope, key.as_uuid(), self.fact_time)
                .await?
                .is_none();
        Ok(Some(PreviousFound::Row { existing, alone }))
    }

    /// The answer that the previous key's row gives, once the transaction is gone: a fact
    /// that succeeded under the previous definition is a duplicate, with the result stored
    /// then. One answered by the previous key alone is noted with the scope, which tells
    /// when the previous definition is no longer needed.
    async fn answer_previous<T, E, C: ResultCodec<T>>(
        &self,
        found: PreviousFound,
        codec: &C,
    ) -> Result<Outcome<T>, Error<E>> {
        let Delivery {
            idem, spec, key, ..
        } = *self;
        let scope = spec.scope;
        let (existing, alone) = match found {
            PreviousFound::Mismatch => return Err(Error::PayloadMismatch { key }),
            PreviousFound::Contended => return Err(Error::InProgress { key }),
            PreviousFound::Outside => return Err(self.outside_window()),
            PreviousFound::Row { existing, alone } => (existing, alone),
        };
        if alone
            && let Err(error) = idem
                .statements()
                .previous_key_seen(idem.pool(), scope)
                .await
        {
            tracing::debug!(scope, %error, "idem: the use of the previous key definition could not be noted");
        }
        idem.cache_existing(spec.cache, scope, key, &existing).await;
        decide(key, existing, codec)
    }
}

/// The fact's time `at` with the window of the handler `spec`: the window a cleaner of
/// `idem`'s settings gives the scope (its own, then the one the handler declares, then
/// the default), and the bound ahead.
pub(crate) fn fact_window(idem: &Idem, spec: &HandlerSpec, at: DateTime<Utc>) -> FactWindow {
    let retention = idem.config().retention();
    let window = retention
        .scope_windows()
        .find(|(scope, _)| *scope == spec.scope)
        .map(|(_, window)| window)
        .or(spec.retention)
        .unwrap_or(retention.window());
    let ms =
        |duration: std::time::Duration| i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
    FactWindow {
        at,
        window_ms: ms(window),
        ahead_ms: ms(retention.future_bound_duration()),
    }
}

/// The refusal of the fact of `key` at `fact_time`, outside its window: which side, by
/// this process's clock.
pub(crate) fn outside_window<E>(key: IdempotencyKey, fact_time: DateTime<Utc>) -> Error<E> {
    let edge = if fact_time > Utc::now() {
        WindowEdge::Future
    } else {
        WindowEdge::Past
    };
    Error::OutsideWindow {
        key,
        fact_time,
        edge,
    }
}

/// Whether PostgreSQL's `timestamptz` holds `at` (4713 BC to 294276 AD): a time beyond is
/// outside every window.
pub(crate) fn representable(at: chrono::DateTime<Utc>) -> bool {
    use chrono::Datelike;
    (-4712..=294_275).contains(&at.year())
}

/// What the claim of the previous definition's key found in its way.
enum PreviousFound {
    /// Its row, and whether the fact has no row of its own key.
    Row { existing: Existing, alone: bool },
    /// The previous key was recorded with another payload fingerprint.
    Mismatch,
    /// The row kept changing under the claim.
    Contended,
    /// The previous key is kept by the fact's time, and the fact is outside its window.
    Outside,
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
    /// A key kept by its fact's time, outside the fact's window.
    Outside,
}

/// Claims the key: inserts it (the common case, one statement), or takes over a `failed`
/// key with the same payload, or reads the row that decides the delivery.
async fn claim(
    idem: &Idem,
    conn: &mut PgConnection,
    scope: &str,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
    time: Option<FactWindow>,
    body_lock_timeout: &str,
) -> Result<Claimed, sqlx::Error> {
    let statements = idem.statements();
    let claimed = ClaimedKey {
        scope,
        key: key.as_uuid(),
        fingerprint,
        body_lock_timeout,
        time,
        read_in_the_way: idem.duplicate_rates().read_in_claim(scope),
    };
    let mut claim = statements.claim(conn, claimed).await?;
    // Each turn reads with a new snapshot; a row that keeps changing under it belongs to
    // deliveries that are still working on the key.
    for _ in 0..4 {
        match claim {
            Claim::Won { xid } => return Ok(Claimed::Owned { xid }),
            Claim::Outside => return Ok(Claimed::Outside),
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
