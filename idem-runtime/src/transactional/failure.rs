//! Failures: which count as an attempt of the message, and how an attempt or a body that
//! ended its own transaction is recorded.

use chrono::{DateTime, Utc};

use crate::Idem;
use crate::handler::HandlerSpec;
use crate::key::IdempotencyKey;
use crate::key_transaction::is_no_transaction;
use crate::store::KeyAt;

/// Records a failed attempt of `key` in a short transaction of its own (its lock waits
/// bounded by the lock timeout): the attempts and whether the key is now parked, or
/// `None` when it could not be recorded or another delivery finished the key meanwhile.
/// `fact_time`: the fact's time, where the handler keeps its keys by it.
pub(crate) async fn record_failure(
    idem: &Idem,
    spec: &HandlerSpec,
    key: IdempotencyKey,
    fact_time: Option<DateTime<Utc>>,
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
                KeyAt {
                    scope: spec.scope,
                    key: key.as_uuid(),
                    fact_time,
                },
                fingerprint,
                text,
                max_attempts,
            )
            .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(recorded)
    };
    match recorded.await {
        Ok(recorded) => {
            if recorded.is_some() {
                crate::telemetry::attempt_charged(spec.scope);
            }
            recorded
        }
        Err(error) => {
            tracing::warn!(%key, scope = spec.scope, %error, "could not record a handler failure");
            None
        }
    }
}

/// Whether a failure counts as an attempt of the message: a refusal by PostgreSQL of
/// what the transaction holds (a constraint, an aborted transaction, a value it cannot
/// store, a statement timeout), a serialization failure or deadlock that persisted through
/// the retries, or the handler's own error. Not: a lost or killed connection, a server
/// shutting down or out of resources, a lock timeout, a pool or I/O error (SQLSTATE
/// classes 08, 53, 57 but 57014, 58, and 55P03), nor a server that takes no writes
/// (25006: a standby, or a demoted primary, reached during a failover), nor a prepared
/// statement that the
/// session does not have or already has (26000, 42P05: a pooler that gave the session's
/// transaction to another server connection), nor a table or schema that does not exist
/// (42P01, 3F000: a deployment whose migrations have not run, such as idem-kafka's outbox
/// before its `migrate`), which say nothing about the message.
pub(crate) fn counts_as_attempt(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            let class = code.get(..2).unwrap_or("");
            !(matches!(class, "08" | "53" | "58" | "")
                || (class == "57" && code != "57014")
                || matches!(
                    code,
                    "55P03" | "25006" | "26000" | "42P05" | "42P01" | "3F000"
                ))
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
    crate::error_text::chain(error)
        .find_map(|error| error.downcast_ref::<sqlx::Error>())
        .is_none_or(counts_as_attempt)
}

/// Parks the keys of a transaction that a body ended itself (`COMMIT` or `ROLLBACK`): a
/// key whose row that transaction committed is set from `success` to `parked`; a key that
/// it did not commit is recorded `parked`. Its effects may be partly committed: nothing
/// of it runs again until an operator looks and resets the key.
pub(crate) async fn park_ended(
    idem: &Idem,
    spec: &HandlerSpec,
    keys: &[(IdempotencyKey, Option<&[u8]>)],
    fact_time: Option<DateTime<Utc>>,
    xid: i64,
) {
    const TEXT: &str = "the handler's body ended the transaction that held its key (COMMIT or ROLLBACK in the body, or begin() on its connection); its effects may be partly committed";
    for &(key, fingerprint) in keys {
        let parked = async {
            let mut tx = idem.bounded_transaction().await?;
            let parked = idem
                .statements()
                .park_committed(
                    &mut tx,
                    KeyAt {
                        scope: spec.scope,
                        key: key.as_uuid(),
                        fact_time,
                    },
                    xid,
                    TEXT,
                )
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(parked)
        }
        .await;
        match parked {
            Ok(true) => {}
            Ok(false) => {
                record_failure(idem, spec, key, fact_time, fingerprint, TEXT, 1).await;
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
