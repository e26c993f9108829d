//! Batches: many messages' keys claimed in one statement and committed once.
//!
//! A Kafka consumer receives messages in batches of hundreds. One transaction per message
//! caps throughput at the database's commit rate (one disk sync each); a batch pays one
//! commit for all its messages and keeps every guarantee per message:
//!
//! 1. the keys are derived; a message whose key cannot be derived gets [`Error::Key`],
//!    and a message whose key appeared earlier in the batch is a duplicate of that one;
//! 2. `BEGIN`, then one statement claims every key (`INSERT ... SELECT FROM unnest(...)
//!    ON CONFLICT DO NOTHING`, in key order so that concurrent batches cannot deadlock)
//!    and reads the rows in the way; `failed` keys are taken over in one more statement;
//! 3. the body runs for each claimed message, in order, on the same connection;
//! 4. one statement stores the results, and one `COMMIT` makes all effects and all
//!    `success` rows visible together.
//!
//! **When a body fails** (or PostgreSQL reports a serialization failure or deadlock), the
//! batch transaction rolls back as a whole and the claimed messages are processed again
//! one by one with [`transactional::run`](crate::transactional::run()): the failing message
//! records its failure, the others commit on their own. The happy path pays nothing for
//! this (no savepoint per message, which would cost two round trips each), and no message
//! is lost or applied twice.

use std::collections::HashMap;
use std::future::Future;

use sqlx::{Postgres, Row, Transaction};
use uuid::Uuid;

use crate::Idem;
use crate::handler::{HandlerSpec, ResultCodec};
use crate::key::{IdempotencyKey, KeyError};
use crate::outcome::{Error, HandlerError, Outcome};
use crate::store::{Existing, Status};
use crate::transactional;

/// The outcome of each message of a batch, in the order of the messages.
pub type BatchOutcomes<T, E> = Vec<Result<Outcome<T>, Error<E>>>;

/// What happens to one message of the batch.
enum Plan {
    /// Decided before the batch transaction (key error, duplicate inside the batch).
    Done,
    /// A duplicate of the message at this earlier index of the batch.
    SameAs(usize),
    /// Claimed, or to be decided by the claim.
    Claim,
}

/// Runs `body` for every message of `messages` whose key has not succeeded yet, in one
/// transaction with the claims of all their keys.
///
/// `derive` gives each message's key and payload fingerprint. `body` receives the open
/// transaction and one message and hands the transaction back with its result. Returns
/// one outcome per message, in order. This is what `#[idempotent(batch = true)]`
/// generates a call of (as `<handler>_batch`).
pub async fn run<'m, M, T, E, C, D, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    messages: &'m [M],
    mut derive: D,
    codec: C,
    mut body: F,
) -> BatchOutcomes<T, E>
where
    C: ResultCodec<T> + Copy,
    E: HandlerError,
    D: FnMut(&'m M) -> Result<(IdempotencyKey, Option<[u8; 32]>), KeyError>,
    F: FnMut(Transaction<'static, Postgres>, &'m M) -> Fut,
    Fut: Future<Output = (Transaction<'static, Postgres>, Result<T, E>)>,
{
    let mut outcomes: Vec<Option<Result<Outcome<T>, Error<E>>>> =
        messages.iter().map(|_| None).collect();
    let mut derived = Vec::with_capacity(messages.len());
    let mut plans = Vec::with_capacity(messages.len());
    let mut first_of_key: HashMap<IdempotencyKey, usize> = HashMap::new();
    for (index, message) in messages.iter().enumerate() {
        match derive(message) {
            Err(error) => {
                outcomes[index] = Some(Err(Error::Key(error)));
                derived.push(None);
                plans.push(Plan::Done);
            }
            Ok((key, fingerprint)) => {
                match first_of_key.get(&key) {
                    Some(&first) => {
                        let same_payload = match (&derived[first], fingerprint) {
                            (Some((_, Some(theirs))), Some(ours)) => *theirs == ours,
                            _ => true,
                        };
                        if same_payload {
                            plans.push(Plan::SameAs(first));
                        } else {
                            outcomes[index] = Some(Err(Error::PayloadMismatch { key }));
                            plans.push(Plan::Done);
                        }
                    }
                    None => {
                        first_of_key.insert(key, index);
                        plans.push(Plan::Claim);
                    }
                }
                derived.push(Some((key, fingerprint)));
            }
        }
    }

    let claimed: Vec<usize> = plans
        .iter()
        .enumerate()
        .filter_map(|(index, plan)| matches!(plan, Plan::Claim).then_some(index))
        .collect();
    let keyed = |index: usize| derived[index].expect("claimed messages have keys");

    match in_one_transaction(idem, spec, messages, &claimed, &keyed, codec, &mut body).await {
        Ok(batch) => {
            for (index, outcome) in batch {
                outcomes[index] = Some(outcome);
            }
        }
        Err(fallback) => {
            tracing::debug!(
                scope = spec.scope,
                messages = claimed.len(),
                reason = %fallback,
                "batch rolled back; processing its messages one by one"
            );
            for &index in &claimed {
                let (key, fingerprint) = keyed(index);
                let message = &messages[index];
                let outcome =
                    transactional::run(idem, spec, key, fingerprint, codec, |tx| body(tx, message))
                        .await;
                outcomes[index] = Some(outcome);
            }
        }
    }

    // Duplicates inside the batch share the outcome of the first message with their key.
    for index in 0..messages.len() {
        if let Plan::SameAs(first) = plans[index] {
            let (key, _) = keyed(index);
            outcomes[index] = Some(match &outcomes[first] {
                Some(Ok(Outcome::Executed(value) | Outcome::Duplicate(Some(value)))) => {
                    replay(codec, key, value)
                }
                Some(Ok(Outcome::Duplicate(None))) | None => Ok(Outcome::Duplicate(None)),
                Some(Err(error)) => Err(same_error(error, key)),
            });
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| outcome.expect("every message has an outcome"))
        .collect()
}

/// A duplicate's copy of a value, through the codec (as a duplicate from the table gets it).
fn replay<T, E, C: ResultCodec<T>>(
    codec: C,
    key: IdempotencyKey,
    value: &T,
) -> Result<Outcome<T>, Error<E>> {
    let stored = codec.encode(value).map_err(Error::ResultEncoding)?;
    codec
        .decode(stored)
        .map(Outcome::Duplicate)
        .map_err(|source| Error::StoredResult { key, source })
}

/// What a duplicate inside the batch is told when the first message with its key failed.
fn same_error<E>(error: &Error<E>, key: IdempotencyKey) -> Error<E> {
    match error {
        Error::Parked {
            attempts,
            last_error,
            ..
        } => Error::Parked {
            key,
            attempts: *attempts,
            last_error: last_error.clone(),
        },
        Error::PayloadMismatch { .. } => Error::PayloadMismatch { key },
        // The first delivery failed or is in progress: this one may be retried later.
        _ => Error::InProgress { key },
    }
}

/// Why the batch transaction was abandoned for per-message processing.
#[derive(Debug, thiserror::Error)]
enum Fallback {
    #[error("a handler failed")]
    HandlerFailed,
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

#[allow(clippy::too_many_arguments)]
async fn in_one_transaction<'m, M, T, E, C, F, Fut>(
    idem: &Idem,
    spec: &HandlerSpec,
    messages: &'m [M],
    claimed: &[usize],
    keyed: &impl Fn(usize) -> (IdempotencyKey, Option<[u8; 32]>),
    codec: C,
    body: &mut F,
) -> Result<Vec<(usize, Result<Outcome<T>, Error<E>>)>, Fallback>
where
    C: ResultCodec<T> + Copy,
    F: FnMut(Transaction<'static, Postgres>, &'m M) -> Fut,
    Fut: Future<Output = (Transaction<'static, Postgres>, Result<T, E>)>,
{
    let mut results = Vec::with_capacity(claimed.len());
    if claimed.is_empty() {
        return Ok(results);
    }
    let table = format!("{}.idem_keys", idem.config().schema());
    let scope = spec.scope;
    let keys: Vec<Uuid> = claimed.iter().map(|&i| keyed(i).0.as_uuid()).collect();
    let fingerprints: Vec<Option<Vec<u8>>> = claimed
        .iter()
        .map(|&i| keyed(i).1.map(|f| f.to_vec()))
        .collect();

    let mut tx = idem
        .pool()
        .begin_with(idem.statements().begin.clone())
        .await?;
    let rows = sqlx::query(&format!(
        "WITH input AS ( \
            SELECT * FROM unnest($2::uuid[], $3::bytea[]) AS i(key, fingerprint)), \
         claimed AS ( \
            INSERT INTO {table} (scope, key, status, attempts, fingerprint) \
            SELECT $1, key, 'success', 1, fingerprint FROM input ORDER BY key \
            ON CONFLICT (scope, key) DO NOTHING \
            RETURNING key) \
         SELECT i.key, c.key IS NOT NULL AS won, k.status, k.attempts, k.fingerprint, k.result, \
                k.last_error, \
                set_config('lock_timeout', current_setting('idem.saved_lock_timeout'), true) AS restored \
         FROM input i \
         LEFT JOIN claimed c ON c.key = i.key \
         LEFT JOIN {table} k ON c.key IS NULL AND k.scope = $1 AND k.key = i.key"
    ))
    .bind(scope)
    .bind(&keys)
    .bind(&fingerprints)
    .fetch_all(&mut *tx)
    .await?;

    let position: HashMap<Uuid, usize> = claimed
        .iter()
        .map(|&index| (keyed(index).0.as_uuid(), index))
        .collect();
    let mut owned = Vec::new();
    let mut failed = Vec::new();
    for row in rows {
        let key: Uuid = row.try_get("key")?;
        let index = position[&key];
        let (idempotency_key, fingerprint) = keyed(index);
        if row.try_get::<bool, _>("won")? {
            owned.push(index);
            continue;
        }
        let Some(status) = row.try_get::<Option<&str>, _>("status")? else {
            // Committed by a transaction this claim waited for: decide it on its own.
            return Err(Fallback::Database(sqlx::Error::RowNotFound));
        };
        let existing = Existing {
            status: Status::parse(status)?,
            attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
            fingerprint: row.try_get("fingerprint")?,
            result: row.try_get("result")?,
            last_error: row.try_get("last_error")?,
        };
        let mismatch = matches!((fingerprint, &existing.fingerprint), (Some(ours), Some(theirs)) if ours.as_slice() != theirs.as_slice());
        if mismatch {
            results.push((
                index,
                Err(Error::PayloadMismatch {
                    key: idempotency_key,
                }),
            ));
        } else if existing.status == Status::Failed {
            failed.push(index);
        } else {
            results.push((
                index,
                transactional::decide(idempotency_key, existing, &codec),
            ));
        }
    }
    if !failed.is_empty() {
        let failed_keys: Vec<Uuid> = failed.iter().map(|&i| keyed(i).0.as_uuid()).collect();
        let retaken: Vec<Uuid> = sqlx::query_scalar(&format!(
            "UPDATE {table} SET status = 'success', attempts = attempts + 1, updated_at = now() \
             WHERE scope = $1 AND key = ANY($2) AND status = 'failed' RETURNING key"
        ))
        .bind(scope)
        .bind(&failed_keys)
        .fetch_all(&mut *tx)
        .await?;
        if retaken.len() != failed.len() {
            // Another delivery finished one of them meanwhile: decide them one by one.
            return Err(Fallback::Database(sqlx::Error::RowNotFound));
        }
        owned.extend(failed);
    }
    owned.sort_unstable();

    let mut stored_keys = Vec::new();
    let mut stored_results = Vec::new();
    let mut values = Vec::with_capacity(owned.len());
    for &index in &owned {
        let (returned, result) = body(tx, &messages[index]).await;
        tx = returned;
        let Ok(value) = result else {
            return Err(Fallback::HandlerFailed);
        };
        // An unencodable result fails this message alone, in the per-message pass.
        let Ok(stored) = codec.encode(&value) else {
            return Err(Fallback::HandlerFailed);
        };
        if let Some(stored) = stored {
            stored_keys.push(keyed(index).0.as_uuid());
            stored_results.push(stored);
        }
        values.push((index, value));
    }
    if !stored_keys.is_empty() {
        sqlx::query(&format!(
            "UPDATE {table} AS k SET result = v.result \
             FROM unnest($2::uuid[], $3::jsonb[]) AS v(key, result) \
             WHERE k.scope = $1 AND k.key = v.key"
        ))
        .bind(scope)
        .bind(&stored_keys)
        .bind(&stored_results)
        .execute(&mut *tx)
        .await?;
    }
    // A body that swallowed a failed statement left the transaction aborted: the check
    // fails then, where a bare COMMIT would roll back without an error.
    transactional::commit_checked(tx, "SELECT 1").await?;
    results.extend(
        values
            .into_iter()
            .map(|(index, value)| (index, Ok(Outcome::Executed(value)))),
    );
    Ok(results)
}
