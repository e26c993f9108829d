//! How a claimed delivery ends: its commit, with the result, after a body that returned
//! `Ok`; its rollback and the failure recorded after a body that returned `Err`.

use std::convert::Infallible;

use super::failure::{
    counts_as_attempt, counts_as_attempt_of, ended_by_body, park_ended, record_failure,
};
use super::{Delivery, Retries, Step};
use crate::config::ErrorTexts;
use crate::error_text::{error_kind, failure_text, is_transient, storable_text};
use crate::faults::{self, BackendKill};
use crate::handler::ResultCodec;
use crate::key_transaction::{Ended, KeyTransaction};
use crate::outcome::{Error, HandlerError, Outcome};

impl Delivery<'_> {
    /// Commits the transaction `xid` with the body's `value` stored for replay and what
    /// the body left for the commit (`at_commit`): the business effects and the key's
    /// `success` become visible together.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit<T, E, C: ResultCodec<T>>(
        &self,
        tx: KeyTransaction,
        xid: i64,
        value: T,
        codec: &C,
        at_commit: &[String],
        kill: &mut BackendKill,
        retries: &mut Retries,
    ) -> Step<Infallible, T, E> {
        let Delivery {
            idem,
            spec,
            key,
            fingerprint,
            previous,
            ..
        } = *self;
        let stored = match codec.encode(&value) {
            Ok(stored) => stored,
            Err(error) => return Step::Done(Err(Error::ResultEncoding(error))),
        };
        // The previous definition's key gets the result too: a build of that definition
        // replays it to its duplicates.
        let commit = idem.statements().commit(
            spec.scope,
            key.as_uuid(),
            previous.map(|previous| (previous.as_uuid(), self.previous_time)),
            self.fact_time,
            stored.as_ref(),
            at_commit,
        );
        // Tests only: a connection lost before the commit (a no-op without the feature
        // `testing`).
        if let Some(lost) = faults::before_commit(idem.faults()) {
            let _ = tx.rollback().await;
            return Step::Done(Err(Error::Database(lost)));
        }
        match kill.during_commit(tx.commit(&commit)).await {
            Ok(()) => {
                idem.cache_success(spec.cache, spec.scope, key, fingerprint, stored.as_ref())
                    .await;
                Step::Done(Ok(Outcome::Executed(value)))
            }
            Err(error) if retries.take(&error).await => Step::Again,
            Err(error) if ended_by_body(&error) => {
                // The previous definition's key, committed with the body's own COMMIT,
                // is parked too: a build of that definition must not take it as done.
                self.park_ended(xid).await;
                Step::Done(Err(Error::TransactionEnded { key }))
            }
            Err(error) if counts_as_attempt(&error) => {
                Step::Done(Err(self.commit_refused(error).await))
            }
            Err(error) => Step::Done(Err(Error::Database(error))),
        }
    }

    /// A commit refused by the server about this transaction (an aborted transaction, a
    /// deferred constraint): an attempt like a handler error, so that a message that can
    /// never commit is parked.
    async fn commit_refused<E>(&self, error: sqlx::Error) -> Error<E> {
        let Delivery { idem, key, .. } = *self;
        let text = match idem.config().error_texts() {
            ErrorTexts::Full => storable_text(&format!("commit failed: {error}")),
            _ => error_kind("commit failed", &error),
        };
        let recorded = self.record_failure(&text).await;
        // The attempt that parks the key says so: dead-letter it now.
        match recorded {
            Some((attempts, true)) => Error::Parked {
                key,
                attempts,
                last_error: text,
            },
            _ => Error::Database(error),
        }
    }

    /// Rolls back after the body's `error` and records the failed attempt, unless the
    /// failure is transient (run again) or not the message's (no attempt counted).
    pub(super) async fn fail<T, E: HandlerError>(
        &self,
        tx: KeyTransaction,
        xid: i64,
        error: E,
        retries: &mut Retries,
    ) -> Step<Infallible, T, E> {
        let Delivery {
            idem, spec, key, ..
        } = *self;
        let scope = spec.scope;
        // The business effects and the claim go; the failure is recorded below. A
        // rollback that cannot reach the server tells of a lost connection, whatever
        // the handler made of the error it got.
        let rolled_back = tx.rollback_after_failure().await;
        if let Ok(Ended::ByBody) = rolled_back {
            // What the body ran after ending the transaction was committed on its own:
            // running it again would apply it twice.
            tracing::warn!(%key, scope, error = %failure_text(&error, idem.config().error_texts()), "the handler's body ended its transaction, then failed; its key is parked");
            self.park_ended(xid).await;
            return Step::Done(Err(Error::TransactionEnded { key }));
        }
        let connection_lost = matches!(rolled_back, Err(ref lost) if !counts_as_attempt(lost));
        if is_transient(error.as_std_error()) && retries.wait().await {
            return Step::Again;
        }
        if connection_lost || !counts_as_attempt_of(error.as_std_error()) {
            // A lost connection, a server going away, a lock timeout: not the
            // message's fault. Nothing is recorded; the next delivery retries.
            tracing::debug!(%key, scope, "handler failed for a reason that is not the message's; no attempt counted");
            return Step::Done(Err(Error::Handler {
                source: error,
                attempts: 0,
                parked: false,
            }));
        }
        let text = failure_text(&error, idem.config().error_texts());
        let (attempts, parked) = self.record_failure(&text).await.unwrap_or((0, false));
        tracing::debug!(%key, scope, attempts, parked, error = %text, "handler failed");
        Step::Done(Err(Error::Handler {
            source: error,
            attempts,
            parked,
        }))
    }

    /// Records a failed attempt of this delivery's key (see [`record_failure`]).
    async fn record_failure(&self, text: &str) -> Option<(u32, bool)> {
        record_failure(
            self.idem,
            self.spec,
            self.key,
            self.fact_time,
            self.fingerprint,
            text,
            self.max_attempts(),
        )
        .await
    }

    /// Parks the keys that the transaction `xid` claimed, after its body ended it: the
    /// key, and the previous definition's key, each in its own table, so that a build of
    /// either definition takes neither as done.
    async fn park_ended(&self, xid: i64) {
        let Delivery {
            idem,
            spec,
            key,
            fingerprint,
            previous,
            ..
        } = *self;
        park_ended(idem, spec, &[(key, fingerprint)], self.fact_time, xid).await;
        if let Some(previous) = previous {
            park_ended(
                idem,
                spec,
                &[(previous, fingerprint)],
                self.previous_time,
                xid,
            )
            .await;
        }
    }
}
