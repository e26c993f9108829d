//! The statements of lease mode: the claim under a lease, its extension and its end.
//! Expiries are computed and compared on the database's clock only.

use std::time::Duration;

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Existing, Statements, Status, attempts_value, existing, failure_recorded, millis};

/// What a lease claim found.
#[derive(Debug)]
pub(crate) enum LeaseClaim {
    /// This worker holds the lease; `attempt` counts this execution.
    Won { attempt: u32 },
    /// The key exists and is not claimable now.
    Existing(Existing),
}

/// The SQL of lease mode, for one status table.
#[derive(Debug)]
pub(super) struct Sql {
    claim_lease: String,
    read_lease: String,
    park_expired: String,
    extend_lease: String,
    complete_lease: String,
    release_lease: String,
    fail_lease: String,
}

impl Sql {
    pub(super) fn new(table: &str) -> Self {
        Sql {
            claim_lease: format!(
                "INSERT INTO {table} AS k \
                    (scope, key, status, attempts, fingerprint, lease_owner, lease_expires_at) \
                 VALUES ($1, $2, 'processing', 1, $3, $4, now() + $5 * interval '1 millisecond') \
                 ON CONFLICT (scope, key) DO UPDATE \
                 SET status = 'processing', attempts = k.attempts + 1, \
                     lease_owner = EXCLUDED.lease_owner, lease_expires_at = EXCLUDED.lease_expires_at, \
                     fingerprint = coalesce(k.fingerprint, EXCLUDED.fingerprint), \
                     updated_at = now() \
                 WHERE (k.status = 'failed' \
                        OR (k.status = 'processing' AND k.lease_expires_at <= now() AND k.attempts < $6)) \
                   AND (k.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL \
                        OR k.fingerprint = EXCLUDED.fingerprint) \
                 RETURNING k.attempts"
            ),
            read_lease: format!(
                "SELECT status, attempts, fingerprint, result, last_error, \
                        coalesce(lease_expires_at <= now(), false) AS expired \
                 FROM {table} WHERE scope = $1 AND key = $2"
            ),
            // A lease that expired as often as `max_attempts` allows: its worker keeps dying.
            // Only then: a claim can also miss an expired lease that has attempts left (a
            // payload mismatch, or a lease that expired after the claim statement looked).
            park_expired: format!(
                "UPDATE {table} SET status = 'parked', lease_expires_at = NULL, updated_at = now(), \
                     last_error = coalesce(last_error, 'the lease expired before the handler completed') \
                 WHERE scope = $1 AND key = $2 AND status = 'processing' AND lease_expires_at <= now() \
                   AND attempts >= $3 \
                 RETURNING attempts, last_error"
            ),
            extend_lease: format!(
                "UPDATE {table} SET lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND lease_owner = $3 AND status = 'processing'"
            ),
            // Also true for this lease's own success recorded already: a completion sent
            // again after its connection was lost, the first one having committed.
            complete_lease: format!(
                "UPDATE {table} SET status = 'success', result = $4::text::json, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND lease_owner = $3 \
                   AND (status = 'processing' OR (status = 'success' AND lease_expires_at IS NULL))"
            ),
            // A failure that is not the message's: the lease goes, and so does the attempt
            // its claim counted.
            release_lease: format!(
                "UPDATE {table} SET status = 'failed', attempts = greatest(attempts - 1, 0), \
                     last_error = $4, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND lease_owner = $3 AND status = 'processing' \
                 RETURNING attempts, status"
            ),
            fail_lease: format!(
                "UPDATE {table} SET status = CASE WHEN attempts >= $5 THEN 'parked' ELSE 'failed' END, \
                     last_error = $4, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND lease_owner = $3 AND status = 'processing' \
                 RETURNING attempts, status"
            ),
        }
    }
}

impl Statements {
    /// The row of `key` when it decides a lease-mode delivery without a claim: `success`,
    /// `parked`, or a lease that has not expired. A plain read: no lock, no wait, no write.
    pub(crate) async fn settled_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<Existing>, sqlx::Error> {
        let Some(row) = self
            .query(&self.lease.read_lease, &[scope.into(), key.into()])
            .fetch_optional(conn)
            .await?
        else {
            return Ok(None);
        };
        let existing = existing(&row)?;
        let expired: bool = row.try_get("expired")?;
        Ok(match existing.status {
            Status::Success | Status::Parked => Some(existing),
            Status::Processing if !expired => Some(existing),
            Status::Processing | Status::Failed => None,
        })
    }

    /// Claims `key` under a lease, or reads the row that is in the way.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        fingerprint: Option<&[u8]>,
        token: Uuid,
        lease: Duration,
        max_attempts: u32,
    ) -> Result<LeaseClaim, sqlx::Error> {
        let won = self
            .query(
                &self.lease.claim_lease,
                &[
                    scope.into(),
                    key.into(),
                    fingerprint.into(),
                    token.into(),
                    millis(lease).into(),
                    attempts_value(max_attempts),
                ],
            )
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = won {
            let attempt = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
            return Ok(LeaseClaim::Won { attempt });
        }
        let Some(row) = self
            .query(&self.lease.read_lease, &[scope.into(), key.into()])
            .fetch_optional(&mut *conn)
            .await?
        else {
            // Purged between the two statements: an empty table again.
            return Box::pin(self.claim_lease(
                conn,
                scope,
                key,
                fingerprint,
                token,
                lease,
                max_attempts,
            ))
            .await;
        };
        let mut existing = existing(&row)?;
        if existing.status == Status::Processing && row.try_get::<bool, _>("expired")? {
            // Expired, and not reclaimed above: park it if it used up its attempts.
            if let Some(row) = self
                .query(
                    &self.lease.park_expired,
                    &[scope.into(), key.into(), attempts_value(max_attempts)],
                )
                .fetch_optional(conn)
                .await?
            {
                existing.status = Status::Parked;
                existing.attempts = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
                existing.last_error = row.try_get("last_error")?;
            }
        }
        Ok(LeaseClaim::Existing(existing))
    }

    /// Moves the lease's expiry to `lease` from now; `false` when it is no longer ours.
    pub(crate) async fn extend_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        lease: Duration,
    ) -> Result<bool, sqlx::Error> {
        let done = self
            .query(
                &self.lease.extend_lease,
                &[scope.into(), key.into(), token.into(), millis(lease).into()],
            )
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks the key `success` if the lease is still ours; `false` when it is not.
    pub(crate) async fn complete_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        result: Option<&serde_json::Value>,
    ) -> Result<bool, sqlx::Error> {
        let result = result.map(serde_json::Value::to_string);
        let done = self
            .query(
                &self.lease.complete_lease,
                &[
                    scope.into(),
                    key.into(),
                    token.into(),
                    result.as_deref().into(),
                ],
            )
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a failure if the lease is still ours: the attempts and whether the key is
    /// now parked, or `None` when the lease is lost.
    pub(crate) async fn fail_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        error: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        self.end_lease(
            &self.lease.fail_lease,
            conn,
            scope,
            key,
            token,
            error,
            Some(max_attempts),
        )
        .await
    }

    /// Releases the lease without the attempt its claim counted (a failure that is not
    /// the message's), if it is still ours: the attempts, or `None` when the lease is lost.
    pub(crate) async fn release_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        error: &str,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        self.end_lease(
            &self.lease.release_lease,
            conn,
            scope,
            key,
            token,
            error,
            None,
        )
        .await
    }

    /// Runs `statement` on the lease of `key` held by `token` with `$1` scope, `$2` key,
    /// `$3` token, `$4` the error text and, where given, `$5` the attempts that park.
    #[allow(clippy::too_many_arguments)]
    async fn end_lease(
        &self,
        statement: &str,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        error: &str,
        max_attempts: Option<u32>,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let mut values = vec![scope.into(), key.into(), token.into(), error.into()];
        values.extend(max_attempts.map(attempts_value));
        let row = self.query(statement, &values).fetch_optional(conn).await?;
        row.as_ref().map(failure_recorded).transpose()
    }
}
