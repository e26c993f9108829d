//! The status table: its statements, rows and the reads and writes outside a handler.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};
use uuid::Uuid;

use crate::config::Config;
use crate::key::IdempotencyKey;

/// The status of a key in the status table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Lease mode: a worker holds the key until its lease expires.
    Processing,
    /// The handler succeeded; the key is final.
    Success,
    /// The last attempt failed; the next delivery retries.
    Failed,
    /// `max_attempts` attempts failed; no retry until [`Idem::reset`](crate::Idem::reset).
    Parked,
}

impl Status {
    pub(crate) fn parse(text: &str) -> Result<Self, sqlx::Error> {
        match text {
            "processing" => Ok(Status::Processing),
            "success" => Ok(Status::Success),
            "failed" => Ok(Status::Failed),
            "parked" => Ok(Status::Parked),
            other => Err(sqlx::Error::Decode(
                format!("unknown idem status {other:?}").into(),
            )),
        }
    }
}

/// A row of the status table, as [`Idem::record`](crate::Idem::record) returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRecord {
    /// The handler's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: IdempotencyKey,
    /// Where the key stands.
    pub status: Status,
    /// Executions of the body (failed ones, plus the successful one).
    pub attempts: u32,
    /// The last recorded error text.
    pub last_error: Option<String>,
    /// The stored result (JSON).
    pub result: Option<serde_json::Value>,
    /// When the key was first recorded.
    pub created_at: DateTime<Utc>,
    /// When the key last changed.
    pub updated_at: DateTime<Utc>,
}

impl<'r> FromRow<'r, PgRow> for KeyRecord {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(KeyRecord {
            scope: row.try_get("scope")?,
            key: IdempotencyKey::from_uuid(row.try_get("key")?),
            status: Status::parse(row.try_get("status")?)?,
            attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
            last_error: row.try_get("last_error")?,
            result: row.try_get("result")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

/// The existing row that a claim ran into.
#[derive(Debug)]
pub(crate) struct Existing {
    pub status: Status,
    pub attempts: u32,
    pub fingerprint: Option<Vec<u8>>,
    pub result: Option<serde_json::Value>,
    pub last_error: Option<String>,
}

/// What the claim statement found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// This transaction inserted the key, or took over a `failed` one.
    Won,
    /// The key exists and is not ours: succeeded, parked, held by a lease, or recorded
    /// with another payload fingerprint.
    Existing(Existing),
}

fn existing(row: &PgRow) -> Result<Existing, sqlx::Error> {
    Ok(Existing {
        status: Status::parse(row.try_get("status")?)?,
        attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
        fingerprint: row.try_get("fingerprint")?,
        result: row.try_get("result")?,
        last_error: row.try_get("last_error")?,
    })
}

/// What a lease claim found.
#[derive(Debug)]
pub(crate) enum LeaseClaim {
    /// This worker holds the lease; `attempt` counts this execution.
    Won { attempt: u32 },
    /// The key exists and is not claimable now.
    Existing(Existing),
}

/// The attempts and whether the key is now parked, from a statement recording a failure.
fn failure_recorded(row: &PgRow) -> Result<(u32, bool), sqlx::Error> {
    let attempts = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
    let parked = row.try_get::<&str, _>("status")? == "parked";
    Ok((attempts, parked))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The SQL of one configured status table, built once per runtime handle.
#[derive(Debug)]
pub(crate) struct Statements {
    pub begin: String,
    claim: String,
    claim_lock_timeout_ms: i32,
    table: String,
    record_failure: String,
    record: String,
    reset: String,
    claim_lease: String,
    read_lease: String,
    park_expired: String,
    extend_lease: String,
    complete_lease: String,
    fail_lease: String,
}

impl Statements {
    pub fn new(config: &Config) -> Self {
        let table = format!("{}.idem_keys", config.schema);
        let lock_timeout_ms = config.lock_timeout.as_millis().max(1);
        Statements {
            // One round trip: open the transaction, remember the session's lock timeout and
            // bound how long the claim may wait behind an in-flight claim of the same key.
            begin: format!(
                "BEGIN; SELECT set_config('idem.saved_lock_timeout', current_setting('lock_timeout'), true); \
                 SET LOCAL lock_timeout = '{lock_timeout_ms}ms'"
            ),
            // Claim, take over a failed key, or read the row that is in the way: one call
            // of the function that migrations 0002 and 0004 create (plans cached per session).
            claim: format!(
                "SELECT won, status, attempts, fingerprint, result, last_error \
                 FROM {schema}.idem_claim($1, $2, $3, $4)",
                schema = config.schema
            ),
            claim_lock_timeout_ms: i32::try_from(lock_timeout_ms).unwrap_or(i32::MAX),
            // After the handler's transaction rolled back. Never overwrites a success (or a
            // parked key) that another delivery wrote meanwhile.
            record_failure: format!(
                "INSERT INTO {table} AS k (scope, key, status, attempts, fingerprint, last_error) \
                 VALUES ($1, $2, CASE WHEN $5 <= 1 THEN 'parked' ELSE 'failed' END, 1, $3, $4) \
                 ON CONFLICT (scope, key) DO UPDATE \
                 SET attempts = k.attempts + 1, \
                     status = CASE WHEN k.attempts + 1 >= $5 THEN 'parked' ELSE 'failed' END, \
                     last_error = EXCLUDED.last_error, updated_at = now() \
                 WHERE k.status = 'failed' \
                 RETURNING attempts, status"
            ),
            record: format!(
                "SELECT scope, key, status, attempts, last_error, result, created_at, updated_at \
                 FROM {table} WHERE scope = $1 AND key = $2"
            ),
            reset: format!(
                "UPDATE {table} SET status = 'failed', attempts = 0, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND status IN ('failed', 'parked')"
            ),
            table: table.clone(),
            // Lease mode. Expiry is computed and compared on the database's clock only.
            claim_lease: format!(
                "INSERT INTO {table} AS k \
                    (scope, key, status, attempts, fingerprint, lease_owner, lease_expires_at) \
                 VALUES ($1, $2, 'processing', 1, $3, $4, now() + $5 * interval '1 millisecond') \
                 ON CONFLICT (scope, key) DO UPDATE \
                 SET status = 'processing', attempts = k.attempts + 1, \
                     lease_owner = EXCLUDED.lease_owner, lease_expires_at = EXCLUDED.lease_expires_at, \
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
            complete_lease: format!(
                "UPDATE {table} SET status = 'success', result = $4, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND lease_owner = $3 AND status = 'processing'"
            ),
            fail_lease: format!(
                "UPDATE {table} SET status = CASE WHEN attempts >= $5 THEN 'parked' ELSE 'failed' END, \
                     last_error = $4, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND lease_owner = $3 AND status = 'processing' \
                 RETURNING attempts, status"
            ),
        }
    }

    pub async fn claim(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        fingerprint: Option<&[u8]>,
    ) -> Result<Claim, sqlx::Error> {
        let row = sqlx::query(&self.claim)
            .bind(scope)
            .bind(key)
            .bind(fingerprint)
            .bind(self.claim_lock_timeout_ms)
            .fetch_one(conn)
            .await?;
        if row.try_get::<bool, _>("won")? {
            Ok(Claim::Won)
        } else {
            existing(&row).map(Claim::Existing)
        }
    }

    /// The `UPDATE` storing `result`, with its values inlined (hex-encoded, so no value
    /// can be read as SQL), to be sent in one simple query with the commit.
    pub fn store_result_inline(
        &self,
        scope: &str,
        key: Uuid,
        result: &serde_json::Value,
    ) -> String {
        format!(
            "UPDATE {table} SET result = convert_from(decode('{result}', 'hex'), 'UTF8')::jsonb \
             WHERE scope = convert_from(decode('{scope}', 'hex'), 'UTF8') AND key = '{key}'",
            table = self.table,
            result = hex(result.to_string().as_bytes()),
            scope = hex(scope.as_bytes()),
        )
    }

    /// Records a failed attempt; returns the attempts and whether the key is now parked,
    /// or `None` when another delivery had already finished the key.
    pub async fn record_failure(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        fingerprint: Option<&[u8]>,
        error: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let row = sqlx::query(&self.record_failure)
            .bind(scope)
            .bind(key)
            .bind(fingerprint)
            .bind(error)
            .bind(i32::try_from(max_attempts).unwrap_or(i32::MAX))
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(failure_recorded).transpose()
    }

    pub async fn record(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<KeyRecord>, sqlx::Error> {
        sqlx::query_as(&self.record)
            .bind(scope)
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    pub async fn reset(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&self.reset)
            .bind(scope)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Claims `key` under a lease, or reads the row that is in the way.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        fingerprint: Option<&[u8]>,
        token: Uuid,
        lease: Duration,
        max_attempts: u32,
    ) -> Result<LeaseClaim, sqlx::Error> {
        let won = sqlx::query(&self.claim_lease)
            .bind(scope)
            .bind(key)
            .bind(fingerprint)
            .bind(token)
            .bind(millis(lease))
            .bind(i32::try_from(max_attempts).unwrap_or(i32::MAX))
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = won {
            let attempt = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
            return Ok(LeaseClaim::Won { attempt });
        }
        let Some(row) = sqlx::query(&self.read_lease)
            .bind(scope)
            .bind(key)
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
            if let Some(row) = sqlx::query(&self.park_expired)
                .bind(scope)
                .bind(key)
                .bind(i32::try_from(max_attempts).unwrap_or(i32::MAX))
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
    pub async fn extend_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        lease: Duration,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&self.extend_lease)
            .bind(scope)
            .bind(key)
            .bind(token)
            .bind(millis(lease))
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks the key `success` if the lease is still ours; `false` when it is not.
    pub async fn complete_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        result: Option<&serde_json::Value>,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&self.complete_lease)
            .bind(scope)
            .bind(key)
            .bind(token)
            .bind(result)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a failure if the lease is still ours: the attempts and whether the key is
    /// now parked, or `None` when the lease is lost.
    pub async fn fail_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        error: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let row = sqlx::query(&self.fail_lease)
            .bind(scope)
            .bind(key)
            .bind(token)
            .bind(error)
            .bind(i32::try_from(max_attempts).unwrap_or(i32::MAX))
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(failure_recorded).transpose()
    }
}
