//! The statements of a batch: every key of the batch claimed in one statement, the
//! `failed` ones taken over in one more, the results stored in one.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row};
use uuid::Uuid;

use super::{Existing, Statements, Status};

/// The SQL of batches, for one status table.
#[derive(Debug)]
pub(super) struct Sql {
    /// Claims every key of a batch, returning the keys in the way.
    claim: String,
    /// Takes over the `failed` keys of a batch.
    retake: String,
    /// Stores the results of a batch's new messages.
    store_results: String,
}

impl Sql {
    pub(super) fn new(table: &str) -> Self {
        Sql {
            claim: format!(
                "WITH input AS ( \
                SELECT * FROM unnest($2::uuid[], $3::bytea[]) AS i(key, fingerprint)), \
                claimed AS ( \
                INSERT INTO {table} (scope, key, status, attempts, fingerprint) \
                SELECT $1, key, 'success', 1, fingerprint FROM input ORDER BY key \
                ON CONFLICT (scope, key) DO NOTHING \
                RETURNING key), \
                lost AS ( \
                SELECT i.key FROM input i WHERE NOT EXISTS (SELECT FROM claimed c WHERE c.key = i.key)) \
                SELECT (SELECT pg_current_xact_id_if_assigned()::text::bigint FROM claimed LIMIT 1) AS xid, \
                CASE WHEN coalesce(bool_and(k.status IS DISTINCT FROM 'failed'), true) \
                THEN set_config('lock_timeout', $4, true) END AS restored, \
                array_agg(l.key) AS keys, array_agg(k.status) AS statuses, \
                array_agg(k.attempts) AS attempts, array_agg(k.fingerprint) AS fingerprints, \
                array_agg(k.result) AS results, array_agg(k.last_error) AS last_errors \
                FROM lost l \
                LEFT JOIN {table} k ON k.scope = $1 AND k.key = l.key"
            ),
            retake: format!(
                "UPDATE {table} AS k SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                fingerprint = coalesce(k.fingerprint, f.fingerprint) \
                FROM unnest($2::uuid[], $3::bytea[]) AS f(key, fingerprint) \
                WHERE k.scope = $1 AND k.key = f.key AND k.status = 'failed' \
                RETURNING k.key, pg_current_xact_id()::text::bigint"
            ),
            store_results: format!(
                "UPDATE {table} AS k SET result = v.result \
                FROM unnest($2::uuid[], $3::json[]) AS v(key, result) \
                WHERE k.scope = $1 AND k.key = v.key"
            ),
        }
    }
}

/// What the claim of a batch's keys found.
#[derive(Debug)]
pub(crate) struct BatchClaim {
    /// The transaction's id, if it wrote anything.
    pub xid: Option<i64>,
    /// The keys that were in the way, each with its row; `None`: the row was committed by
    /// a transaction that the claim waited for, and is not in the claim's snapshot.
    pub in_the_way: Vec<(Uuid, Option<Existing>)>,
}

/// An array column of the claim's row: empty when the aggregate had no rows (NULL).
fn column<T>(row: &PgRow, name: &str) -> Result<Vec<T>, sqlx::Error>
where
    Vec<T>: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    Ok(row.try_get::<Option<Vec<T>>, _>(name)?.unwrap_or_default())
}

impl Statements {
    /// Claims every key of `keys` (with its fingerprint) in the caller's transaction, in key
    /// order. Only the keys in the way come back, as arrays in one row (an aggregate
    /// always yields one): the happy path returns no row data but the transaction's id. A
    /// claim that met no `failed` key sets the lock timeout to `body_lock_timeout`.
    pub(crate) async fn claim_batch(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
        body_lock_timeout: &str,
    ) -> Result<BatchClaim, sqlx::Error> {
        let row = self
            .query(
                &self.batch.claim,
                &[
                    scope.into(),
                    keys.into(),
                    fingerprints.into(),
                    body_lock_timeout.into(),
                ],
            )
            .fetch_one(conn)
            .await?;
        let xid: Option<i64> = row.try_get("xid")?;
        let lost: Vec<Uuid> = column(&row, "keys")?;
        if lost.is_empty() {
            return Ok(BatchClaim {
                xid,
                in_the_way: Vec::new(),
            });
        }
        let statuses: Vec<Option<String>> = column(&row, "statuses")?;
        let attempts: Vec<Option<i32>> = column(&row, "attempts")?;
        let fingerprints: Vec<Option<Vec<u8>>> = column(&row, "fingerprints")?;
        let results: Vec<Option<serde_json::Value>> = column(&row, "results")?;
        let last_errors: Vec<Option<String>> = column(&row, "last_errors")?;
        let rows = lost
            .into_iter()
            .zip(statuses)
            .zip(attempts)
            .zip(fingerprints)
            .zip(results)
            .zip(last_errors);
        let mut in_the_way = Vec::new();
        for (((((key, status), attempts), fingerprint), result), last_error) in rows {
            let existing = match status {
                Some(status) => Some(Existing {
                    status: Status::parse(&status)?,
                    attempts: attempts.and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
                    fingerprint,
                    result,
                    last_error,
                }),
                None => None,
            };
            in_the_way.push((key, existing));
        }
        Ok(BatchClaim { xid, in_the_way })
    }

    /// Takes over the `failed` keys of `keys` (with their fingerprints) in the caller's
    /// transaction: the keys taken, each with the transaction's id.
    pub(crate) async fn retake_batch(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
    ) -> Result<Vec<(Uuid, i64)>, sqlx::Error> {
        self.query(
            &self.batch.retake,
            &[scope.into(), keys.into(), fingerprints.into()],
        )
        .fetch_all_as(conn)
        .await
    }

    /// Sets the transaction's lock timeout to `lock_timeout` (the session's own, for the
    /// body, after a takeover that ran with the claim's).
    pub(crate) async fn restore_lock_timeout(
        &self,
        conn: &mut PgConnection,
        lock_timeout: &str,
    ) -> Result<(), sqlx::Error> {
        self.query(
            "SELECT set_config('lock_timeout', $1, true)",
            &[lock_timeout.into()],
        )
        .execute(conn)
        .await
        .map(drop)
    }

    /// Stores the results of a batch's new messages, in one statement.
    pub(crate) async fn store_batch_results(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        results: &[serde_json::Value],
    ) -> Result<(), sqlx::Error> {
        self.query(
            &self.batch.store_results,
            &[scope.into(), keys.into(), results.into()],
        )
        .execute(conn)
        .await
        .map(drop)
    }
}
