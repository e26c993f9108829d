//! The statements of the operator API ([`admin`](crate::admin)): rows of the status table
//! selected by a filter, the bulk retry and release of keys, the overview's counts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, PgPool, Row};
use uuid::Uuid;

use super::{Statements, Status, Value, millis};

/// A row of the status table, for operators: everything but the stored result's bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KeyRow {
    /// The handler's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: Uuid,
    /// `processing`, `success`, `failed` or `parked`.
    pub status: String,
    /// Executions of the body (failed ones, plus the successful one).
    pub attempts: i32,
    /// The payload fingerprint (SHA-256, hex), when the handler declares one.
    pub fingerprint: Option<String>,
    /// The stored result (JSON), when the handler stores one.
    pub result: Option<serde_json::Value>,
    /// The last recorded error.
    pub last_error: Option<String>,
    /// Lease mode: the worker holding the lease.
    pub lease_owner: Option<Uuid>,
    /// Lease mode: when the lease expires (database clock).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the key was first recorded.
    pub created_at: DateTime<Utc>,
    /// When the key last changed.
    pub updated_at: DateTime<Utc>,
}

impl<'r> FromRow<'r, PgRow> for KeyRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(KeyRow {
            scope: row.try_get("scope")?,
            key: row.try_get("key")?,
            status: row.try_get("status")?,
            attempts: row.try_get("attempts")?,
            fingerprint: row
                .try_get::<Option<Vec<u8>>, _>("fingerprint")?
                .map(hex::encode),
            result: row.try_get("result")?,
            last_error: row.try_get("last_error")?,
            lease_owner: row.try_get("lease_owner")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

const COLUMNS: &str = "scope, key, status, attempts, fingerprint, result, last_error, \
                       lease_owner, lease_expires_at, created_at, updated_at";

/// Which keys a listing or a bulk change is about. Empty fields select everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyFilter {
    /// Only this scope.
    pub scope: Option<String>,
    /// Only this key (with `scope`).
    pub key: Option<Uuid>,
    /// Only these statuses.
    pub statuses: Vec<Status>,
    /// Only keys whose last change is older than this (database clock).
    pub older_than: Option<Duration>,
}

impl KeyFilter {
    /// Every key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the keys of `scope`.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Only `key` (of the scope given with [`scope`](Self::scope)).
    pub fn key(mut self, key: Uuid) -> Self {
        self.key = Some(key);
        self
    }

    /// Also keys in `status` (no status given: all of them).
    pub fn status(mut self, status: Status) -> Self {
        self.statuses.push(status);
        self
    }

    /// Only keys last changed longer ago than `age`.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }
}

/// The `WHERE` clause of a [`KeyFilter`] over `$1` scope, `$2` key, `$3` statuses, `$4`
/// age in ms.
const SELECTION: &str = "($1::text IS NULL OR scope = $1) \
     AND ($2::uuid IS NULL OR key = $2) \
     AND (cardinality($3::text[]) = 0 OR status = ANY($3)) \
     AND ($4::bigint IS NULL OR updated_at < now() - $4 * interval '1 millisecond')";

impl KeyFilter {
    fn status_texts(&self) -> Vec<String> {
        self.statuses
            .iter()
            .map(|status| status.as_str().to_owned())
            .collect()
    }

    /// The values of [`SELECTION`]'s parameters `$1` to `$4`; `statuses` is
    /// [`status_texts`](Self::status_texts).
    fn values<'a>(&'a self, statuses: &'a [String]) -> [Value<'a>; 4] {
        [
            self.scope.as_deref().into(),
            self.key.into(),
            statuses.into(),
            self.older_than.map(millis).into(),
        ]
    }
}

/// What a bulk change does to the selected `failed` and `parked` keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyChange {
    /// A fresh count of attempts: status `failed`, attempts 0.
    Retry,
    /// The row is deleted.
    Release,
}

impl Statements {
    /// The row of `key` in `scope`, if any.
    pub(crate) async fn key_row(
        &self,
        pool: &PgPool,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<KeyRow>, sqlx::Error> {
        let statement = format!(
            "SELECT {COLUMNS} FROM {} WHERE scope = $1 AND key = $2",
            self.table
        );
        self.query(&statement, &[scope.into(), key.into()])
            .fetch_optional_as(pool)
            .await
    }

    /// Up to `limit` rows of `selection`, in `(scope, key)` order, after `after`.
    pub(crate) async fn key_rows(
        &self,
        pool: &PgPool,
        selection: &KeyFilter,
        after: Option<(&str, Uuid)>,
        limit: u32,
    ) -> Result<Vec<KeyRow>, sqlx::Error> {
        let statement = format!(
            "SELECT {COLUMNS} FROM {} WHERE {SELECTION} \
             AND ($5::text IS NULL OR (scope, key) > ($5, $6::uuid)) \
             ORDER BY scope, key LIMIT $7",
            self.table,
        );
        let statuses = selection.status_texts();
        let (after_scope, after_key) = after.unzip();
        self.query(
            &statement,
            &[
                &selection.values(&statuses)[..],
                &[
                    after_scope.into(),
                    after_key.into(),
                    i64::from(limit).into(),
                ],
            ]
            .concat(),
        )
        .fetch_all_as(pool)
        .await
    }

    /// Applies `change` to the `failed` and `parked` keys of `selection` (or, in a dry run,
    /// changes nothing), in the caller's transaction: the rows changed, as they were.
    pub(crate) async fn change_keys(
        &self,
        conn: &mut PgConnection,
        selection: &KeyFilter,
        change: KeyChange,
        dry_run: bool,
    ) -> Result<Vec<KeyRow>, sqlx::Error> {
        let table = &self.table;
        let write = match change {
            KeyChange::Retry => format!(
                "UPDATE {table} AS k SET status = 'failed', attempts = 0, updated_at = now() FROM"
            ),
            KeyChange::Release => format!("DELETE FROM {table} AS k USING"),
        };
        // The rows as they are, locked (`SKIP LOCKED`: a key that a delivery is retrying
        // right now is left to it), then changed in the same statement.
        let statement = format!(
            "WITH chosen AS ( \
                SELECT {COLUMNS} FROM {table} WHERE {SELECTION} \
                ORDER BY scope, key FOR UPDATE SKIP LOCKED), \
             changed AS ({write} chosen WHERE k.scope = chosen.scope AND k.key = chosen.key \
                         AND k.status IN ('failed', 'parked') AND NOT $5 RETURNING k.scope, k.key) \
             SELECT chosen.* FROM chosen \
             WHERE $5 OR EXISTS (SELECT FROM changed \
                                 WHERE changed.scope = chosen.scope AND changed.key = chosen.key) \
             ORDER BY scope, key"
        );
        let statuses = selection.status_texts();
        self.query(
            &statement,
            &[&selection.values(&statuses)[..], &[dry_run.into()]].concat(),
        )
        .fetch_all_as(conn)
        .await
    }

    /// Keys per scope and status, by scope then status, with the oldest last change among
    /// them (a full scan of the status table).
    pub(crate) async fn status_counts(
        &self,
        pool: &PgPool,
    ) -> Result<Vec<(String, String, i64, DateTime<Utc>)>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT scope, status, count(*), min(updated_at) FROM {} \
                 GROUP BY scope, status ORDER BY scope, status",
                self.table
            ),
            &[],
        )
        .fetch_all_as(pool)
        .await
    }

    /// The lease in progress taken longest ago: its scope, key, when it was taken, when it
    /// expires and whether it has expired.
    pub(crate) async fn oldest_lease(
        &self,
        pool: &PgPool,
    ) -> Result<Option<OldestLeaseRow>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT scope, key, updated_at AS since, lease_expires_at AS expires_at, \
                        coalesce(lease_expires_at <= now(), false) AS expired \
                 FROM {} WHERE status = 'processing' ORDER BY updated_at LIMIT 1",
                self.table
            ),
            &[],
        )
        .fetch_optional_as(pool)
        .await
    }

    /// The status table's size on disk with its indexes and TOAST, in bytes.
    pub(crate) async fn table_bytes(&self, pool: &PgPool) -> Result<i64, sqlx::Error> {
        self.query(
            "SELECT pg_total_relation_size($1::regclass)",
            &[self.table.as_str().into()],
        )
        .fetch_one(pool)
        .await?
        .try_get(0)
    }

    /// The retention windows that scopes' handlers declare, in milliseconds, by scope.
    pub(crate) async fn scope_windows(
        &self,
        pool: &PgPool,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT scope, retention_ms FROM {} WHERE retention_ms IS NOT NULL ORDER BY scope",
                self.scopes_table
            ),
            &[],
        )
        .fetch_all_as(pool)
        .await
    }
}

/// [`Statements::oldest_lease`]'s row: scope, key, since, expires at, expired.
pub(crate) type OldestLeaseRow = (String, Uuid, DateTime<Utc>, Option<DateTime<Utc>>, bool);
