//! The status table: its statements, rows and the reads and writes outside a handler.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};
use uuid::Uuid;

use crate::config::{Config, Pooler};
use crate::key::IdempotencyKey;

mod migrate;
mod sql;

pub use migrate::migrate_schema;

pub(crate) use sql::{Protocol, Query, Value};

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

/// What a claim statement is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimedKey<'a> {
    pub scope: &'a str,
    pub key: Uuid,
    pub fingerprint: Option<&'a [u8]>,
    /// The lock timeout the body runs with: the session's own.
    pub body_lock_timeout: &'a str,
}

/// What the claim statement found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// This transaction inserted the key, or took over a `failed` one; `xid` is the
    /// transaction's id, which the commit checks.
    Won { xid: i64 },
    /// No row back: the claim's insert ran into a row (the takeover statement reads it),
    /// or the takeover found nothing in its snapshot (the row in the way was committed or
    /// deleted while the statement waited). Claim again.
    Again,
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

/// `max_attempts` as the `integer` the statements compare attempts with.
fn attempts_value(max_attempts: u32) -> Value<'static> {
    Value::Int4(i32::try_from(max_attempts).unwrap_or(i32::MAX))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The SQL of one configured status table, built once per runtime handle.
#[derive(Debug)]
pub(crate) struct Statements {
    /// How the statements travel: prepared, or inlined behind a transaction pooler.
    pub protocol: Protocol,
    pub begin: String,
    /// The commit's check: fails in an aborted transaction (SQLSTATE 25P02) and outside a
    /// transaction block (25P01), and needs neither a plan nor a snapshot.
    check: String,
    commit_only: String,
    claim: String,
    takeover: String,
    pub table: String,
    pub scopes_table: String,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub instance: String,
    read: String,
    record_failure: String,
    park_committed: String,
    record: String,
    done: String,
    reset: String,
    claim_lease: String,
    read_lease: String,
    park_expired: String,
    extend_lease: String,
    complete_lease: String,
    fail_lease: String,
    release_lease: String,
    /// Batch handlers: claims every key of a batch, returning the keys in the way.
    pub batch_claim: String,
    /// Batch handlers: takes over the `failed` keys of a batch.
    pub batch_retake: String,
    /// Batch handlers: stores the results of a batch's new messages.
    pub batch_store_results: String,
    /// Records a scope's owner, or reads the one recorded.
    pub register_scope: String,
    /// Records the retention window a scope's handler declares.
    pub record_scope_retention: String,
    /// Forgets a scope's owner.
    pub release_scope: String,
}

/// The columns of a claim's answer: the transaction id when the key was won, the row in
/// the way otherwise.
const CLAIM_COLUMNS: &str = "xid, NULL::text AS status, NULL::integer AS attempts, \
     NULL::bytea AS fingerprint, NULL::json AS result, NULL::text AS last_error";

impl Statements {
    pub fn new(config: &Config) -> Self {
        let schema = &config.schema;
        let table = format!("{schema}.idem_keys");
        let lock_timeout_ms = config.lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        // The row in the way, read in the same statement when nothing was written.
        let in_the_way = |written: &str| {
            format!(
                "SELECT {CLAIM_COLUMNS} FROM {written} \
                 UNION ALL \
                 SELECT NULL, k.status, k.attempts, k.fingerprint, k.result, k.last_error \
                 FROM {table} AS k \
                 WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT FROM {written})"
            )
        };
        // `SAVEPOINT` is refused outside a transaction block, even in the implicit one of a
        // multi-statement query, like every statement in an aborted transaction. Opening
        // it costs no plan, no snapshot and no write; `COMMIT` ends it with the rest.
        let check = "SAVEPOINT idem_commit_check".to_owned();
        Statements {
            protocol: match config.pooler {
                Pooler::Session => Protocol::Prepared,
                Pooler::Transaction => Protocol::Inline,
            },
            commit_only: format!("{check}; COMMIT"),
            check,
            // One round trip: open the transaction and bound its lock waits: the claim's
            // wait behind an in-flight claim of the same key. A claim that wins sets the
            // session's own lock timeout back for the body (`$4` of the claim statements).
            begin: format!("BEGIN; SET LOCAL lock_timeout = '{lock_timeout_ms}ms'"),
            // The common case, a new key, is one insert. No row back: a row is in the way
            // (or was committed while this statement waited behind it), which the
            // takeover statement then reads.
            claim: format!(
                "INSERT INTO {table} AS k (scope, key, status, attempts, fingerprint) \
                 VALUES ($1, $2, 'success', 1, $3) \
                 ON CONFLICT (scope, key) DO NOTHING \
                 RETURNING pg_current_xact_id()::text::bigint AS xid, \
                           set_config('lock_timeout', $4, true) AS restored"
            ),
            // A `failed` key with the same payload is taken over under its row lock; a
            // fingerprint first given now is recorded.
            takeover: format!(
                "WITH claimed AS ( \
                    UPDATE {table} AS k \
                    SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                        fingerprint = coalesce(k.fingerprint, $3) \
                    WHERE k.scope = $1 AND k.key = $2 AND k.status = 'failed' \
                      AND ($3::bytea IS NULL OR k.fingerprint IS NULL OR k.fingerprint = $3) \
                    RETURNING pg_current_xact_id()::text::bigint AS xid, \
                              set_config('lock_timeout', $4, true) AS restored) {}",
                in_the_way("claimed")
            ),
            // The key's row alone, read outside a transaction: answers a duplicate
            // without the claim's transaction (see `duplicate_rate`).
            read: format!(
                "SELECT status, attempts, fingerprint, result, last_error \
                 FROM {table} WHERE scope = $1 AND key = $2"
            ),
            // After the handler's transaction rolled back. Never overwrites a success (or a
            // parked key) that another delivery wrote meanwhile.
            record_failure: format!(
                "INSERT INTO {table} AS k (scope, key, status, attempts, fingerprint, last_error) \
                 VALUES ($1, $2, CASE WHEN $5 <= 1 THEN 'parked' ELSE 'failed' END, 1, $3, $4) \
                 ON CONFLICT (scope, key) DO UPDATE \
                 SET attempts = k.attempts + 1, \
                     status = CASE WHEN k.attempts + 1 >= $5 THEN 'parked' ELSE 'failed' END, \
                     last_error = EXCLUDED.last_error, updated_at = now(), \
                     fingerprint = coalesce(k.fingerprint, EXCLUDED.fingerprint) \
                 WHERE k.status = 'failed' \
                 RETURNING attempts, status"
            ),
            // A row that the transaction `$3` committed itself (its body ran `COMMIT`).
            park_committed: format!(
                "UPDATE {table} SET status = 'parked', last_error = $4, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND xmin = xid($3::text::xid8)"
            ),
            record: format!(
                "SELECT scope, key, status, attempts, last_error, result, created_at, updated_at \
                 FROM {table} WHERE scope = $1 AND key = $2"
            ),
            // Which of a list of keys succeeded with the given fingerprint, in list order.
            done: format!(
                "SELECT coalesce(k.status = 'success' AND (k.fingerprint IS NULL OR l.fingerprint IS NULL \
                                 OR k.fingerprint = l.fingerprint), false) AS done \
                 FROM unnest($2::uuid[], $3::bytea[]) WITH ORDINALITY AS l(key, fingerprint, position) \
                 LEFT JOIN {table} AS k ON k.scope = $1 AND k.key = l.key \
                 ORDER BY l.position"
            ),
            reset: format!(
                "UPDATE {table} SET status = 'failed', attempts = 0, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND status IN ('failed', 'parked')"
            ),
            batch_claim: format!(
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
            batch_retake: format!(
                "UPDATE {table} AS k SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                fingerprint = coalesce(k.fingerprint, f.fingerprint) \
                FROM unnest($2::uuid[], $3::bytea[]) AS f(key, fingerprint) \
                WHERE k.scope = $1 AND k.key = f.key AND k.status = 'failed' \
                RETURNING k.key, pg_current_xact_id()::text::bigint"
            ),
            batch_store_results: format!(
                "UPDATE {table} AS k SET result = v.result \
                FROM unnest($2::uuid[], $3::json[]) AS v(key, result) \
                WHERE k.scope = $1 AND k.key = v.key"
            ),
            scopes_table: format!("{schema}.idem_scopes"),
            register_scope: format!(
                "WITH inserted AS ( \
                    INSERT INTO {schema}.idem_scopes (scope, owner, handler, shared, retention_ms) \
                    VALUES ($1, $2, $3, $2 IS NULL, $4) \
                    ON CONFLICT (scope) DO NOTHING RETURNING owner, handler, shared, retention_ms) \
                 SELECT owner, handler, shared, retention_ms FROM inserted \
                 UNION ALL \
                 SELECT owner, handler, shared, retention_ms FROM {schema}.idem_scopes \
                 WHERE scope = $1 AND NOT EXISTS (SELECT FROM inserted)"
            ),
            record_scope_retention: format!(
                "UPDATE {schema}.idem_scopes SET retention_ms = $2 WHERE scope = $1 \
                 AND retention_ms IS DISTINCT FROM $2"
            ),
            release_scope: format!("DELETE FROM {schema}.idem_scopes WHERE scope = $1"),
            instance: format!(
                "SELECT id::text || ':' || current_database() || ':' || '{schema}' AS identity, \
                        cache_secret \
                 FROM {schema}.idem_instance LIMIT 1"
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

    /// `sql` with `values` for its parameters, as this handle sends statements.
    pub fn query<'q>(&self, sql: &'q str, values: &[Value<'_>]) -> Query<'q> {
        self.protocol.query(sql, values)
    }

    /// Claims `key` in the caller's transaction: inserts it, or answers
    /// [`Claim::Again`] when a row is in the way. A claim that wins sets the lock timeout
    /// to `body_lock_timeout` for the body.
    pub async fn claim(
        &self,
        conn: &mut PgConnection,
        key: ClaimedKey<'_>,
    ) -> Result<Claim, sqlx::Error> {
        self.claim_with(&self.claim, conn, key).await
    }

    /// Takes over a `failed` key with a matching payload, or reads the row in the way
    /// with a new snapshot.
    pub async fn takeover(
        &self,
        conn: &mut PgConnection,
        key: ClaimedKey<'_>,
    ) -> Result<Claim, sqlx::Error> {
        self.claim_with(&self.takeover, conn, key).await
    }

    async fn claim_with(
        &self,
        statement: &str,
        conn: &mut PgConnection,
        key: ClaimedKey<'_>,
    ) -> Result<Claim, sqlx::Error> {
        let row = self
            .query(
                statement,
                &[
                    key.scope.into(),
                    key.key.into(),
                    key.fingerprint.into(),
                    key.body_lock_timeout.into(),
                ],
            )
            .fetch_optional(conn)
            .await?;
        let Some(row) = row else {
            return Ok(Claim::Again);
        };
        match row.try_get::<Option<i64>, _>("xid")? {
            Some(xid) => Ok(Claim::Won { xid }),
            None => existing(&row).map(Claim::Existing),
        }
    }

    /// The key's row, if any, read on its own (one statement, no transaction block).
    pub async fn read(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<Existing>, sqlx::Error> {
        let row = self
            .query(&self.read, &[scope.into(), key.into()])
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(existing).transpose()
    }

    /// The statements that end a won claim's transaction, in one simple query: a check
    /// that fails unless the claim's transaction is still open and not aborted (a body that
    /// swallowed a failed statement, or ran `COMMIT` or `ROLLBACK` itself), the `UPDATE`
    /// storing `result` where there is one, and `COMMIT`.
    ///
    /// The result's values are inlined hex-encoded, so that no value can be read as SQL.
    pub fn commit(
        &self,
        scope: &str,
        key: Uuid,
        result: Option<&serde_json::Value>,
    ) -> std::borrow::Cow<'_, str> {
        match result {
            Some(result) => std::borrow::Cow::Owned(format!(
                "{check}; UPDATE {table} SET result = convert_from(decode('{result}', 'hex'), 'UTF8')::json \
                 WHERE scope = convert_from(decode('{scope}', 'hex'), 'UTF8') AND key = '{key}'; \
                 COMMIT",
                check = self.check,
                table = self.table,
                result = hex::encode(result.to_string()),
                scope = hex::encode(scope),
            )),
            None => std::borrow::Cow::Borrowed(&self.commit_only),
        }
    }

    /// [`commit`](Self::commit) without a result to store.
    pub fn commit_only(&self) -> &str {
        &self.commit_only
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
        let row = self
            .query(
                &self.record_failure,
                &[
                    scope.into(),
                    key.into(),
                    fingerprint.into(),
                    error.into(),
                    attempts_value(max_attempts),
                ],
            )
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(failure_recorded).transpose()
    }

    /// Parks `key` if the transaction `xid` wrote its row and committed; `false` if not.
    pub async fn park_committed(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        xid: i64,
        error: &str,
    ) -> Result<bool, sqlx::Error> {
        let xid = xid.to_string();
        let done = self
            .query(
                &self.park_committed,
                &[scope.into(), key.into(), xid.as_str().into(), error.into()],
            )
            .execute(conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    pub async fn record(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<KeyRecord>, sqlx::Error> {
        self.query(&self.record, &[scope.into(), key.into()])
            .fetch_optional_as(conn)
            .await
    }

    pub async fn done(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[Uuid],
        fingerprints: &[Option<Vec<u8>>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        self.query(
            &self.done,
            &[scope.into(), keys.into(), fingerprints.into()],
        )
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect()
    }

    pub async fn reset(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let done = self
            .query(&self.reset, &[scope.into(), key.into()])
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The row of `key` when it decides a lease-mode delivery without a claim: `success`,
    /// `parked`, or a lease that has not expired. A plain read: no lock, no wait, no write.
    pub async fn settled_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<Existing>, sqlx::Error> {
        let Some(row) = self
            .query(&self.read_lease, &[scope.into(), key.into()])
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
        let won = self
            .query(
                &self.claim_lease,
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
            .query(&self.read_lease, &[scope.into(), key.into()])
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
                    &self.park_expired,
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
    pub async fn extend_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        lease: Duration,
    ) -> Result<bool, sqlx::Error> {
        let done = self
            .query(
                &self.extend_lease,
                &[scope.into(), key.into(), token.into(), millis(lease).into()],
            )
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
        let result = result.map(serde_json::Value::to_string);
        let done = self
            .query(
                &self.complete_lease,
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
    pub async fn fail_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        error: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        self.end_lease(
            &self.fail_lease,
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
    pub async fn release_lease(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: Uuid,
        token: Uuid,
        error: &str,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        self.end_lease(&self.release_lease, conn, scope, key, token, error, None)
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
