//! The statements of the operator API ([`admin`](crate::admin)): rows of the status table
//! and of the time-bucketed table (`idem_timed_keys`) selected by a filter, the bulk retry
//! and release of keys, the overview's counts, the time buckets and what an upkeep of
//! them would do.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, PgPool, Row};
use uuid::Uuid;

use super::{Statements, Status, Value, millis};

/// How many keys a scope has in a status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StatusCount {
    /// The scope.
    pub scope: String,
    /// The status.
    pub status: String,
    /// Keys of the scope in the status.
    pub count: i64,
    /// The oldest last change among them.
    pub oldest: DateTime<Utc>,
    /// The keys are kept by their fact's time, in the time buckets (their handler
    /// declares `event_time`).
    pub timed: bool,
    /// Keys kept by their fact's time: the oldest fact among them.
    pub oldest_fact: Option<DateTime<Utc>>,
    /// Keys kept by their fact's time: the newest fact among them.
    pub newest_fact: Option<DateTime<Utc>>,
}

/// One time bucket: a partition of `idem_timed_keys` holding the keys of the facts whose
/// time is in `[starts_at, ends_at)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TimeBucket {
    /// The partition's name (`idem_timed_keys_YYYYMMDD_HHMMSS`, its start in UTC).
    pub name: String,
    /// The first fact time it holds.
    pub starts_at: DateTime<Utc>,
    /// The first fact time after it.
    pub ends_at: DateTime<Utc>,
    /// Its rows as the catalog estimates them (`pg_class.reltuples`, as the last
    /// `VACUUM` or `ANALYZE` left it; nothing is counted): `None` before the first.
    pub estimated_rows: Option<i64>,
    /// Its size on disk with its indexes and TOAST, in bytes.
    pub bytes: i64,
}

/// The range of a time bucket that the next upkeep would make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BucketRange {
    /// The first fact time it would hold.
    pub starts_at: DateTime<Utc>,
    /// The first fact time after it.
    pub ends_at: DateTime<Utc>,
}

/// A row of the status table, or of the time-bucketed table for the keys of handlers with
/// `event_time` (then with its [`fact_time`](Self::fact_time)), for operators: everything
/// but the stored result's bytes.
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
    /// The fact's time (the handler's `event_time` field, to the microsecond) for a key
    /// kept by it in a time bucket; `None` for a key of the status table.
    pub fact_time: Option<DateTime<Utc>>,
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
            fact_time: row.try_get("fact_time")?,
        })
    }
}

/// The columns of a [`KeyRow`] in the status table, with its `fact_time`: none.
const PLAIN_COLUMNS: &str = "scope, key, status, attempts, fingerprint, result, last_error, \
                             lease_owner, lease_expires_at, created_at, updated_at, \
                             NULL::timestamptz AS fact_time";

/// The columns of a [`KeyRow`] in the time-bucketed table, with the fact's time.
const TIMED_COLUMNS: &str = "scope, key, status, attempts, fingerprint, result, last_error, \
                             lease_owner, lease_expires_at, created_at, updated_at, fact_time";

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
    /// The row of `key` in `scope`, if any: in the status table, or in any bucket of the
    /// time-bucketed table (a scope's keys are in one of the two; a timed key's fact time
    /// is part of its primary key, and is found here by scope and key alone).
    pub(crate) async fn key_row(
        &self,
        pool: &PgPool,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<KeyRow>, sqlx::Error> {
        let statement = format!(
            "SELECT {PLAIN_COLUMNS} FROM {} WHERE scope = $1 AND key = $2 \
             UNION ALL \
             SELECT {TIMED_COLUMNS} FROM {} WHERE scope = $1 AND key = $2 \
             LIMIT 1",
            self.table,
            self.timed_table(),
        );
        self.query(&statement, &[scope.into(), key.into()])
            .fetch_optional_as(pool)
            .await
    }

    /// Up to `limit` rows of `selection` in both tables, in `(scope, key)` order, after
    /// `after`.
    pub(crate) async fn key_rows(
        &self,
        pool: &PgPool,
        selection: &KeyFilter,
        after: Option<(&str, Uuid)>,
        limit: u32,
    ) -> Result<Vec<KeyRow>, sqlx::Error> {
        // Each table's first page by its primary key's order (the time-bucketed one's a
        // merge of its buckets' indexes), then the first of both.
        let page = "AND ($5::text IS NULL OR (scope, key) > ($5, $6::uuid)) \
                    ORDER BY scope, key LIMIT $7";
        let statement = format!(
            "(SELECT {PLAIN_COLUMNS} FROM {} WHERE {SELECTION} {page}) \
             UNION ALL \
             (SELECT {TIMED_COLUMNS} FROM {} WHERE {SELECTION} {page}) \
             ORDER BY scope, key LIMIT $7",
            self.table,
            self.timed_table(),
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

    /// Applies `change` to the `failed` and `parked` keys of `selection` in both tables
    /// (or, in a dry run, changes nothing), in the caller's transaction: the rows
    /// changed, as they were.
    pub(crate) async fn change_keys(
        &self,
        conn: &mut PgConnection,
        selection: &KeyFilter,
        change: KeyChange,
        dry_run: bool,
    ) -> Result<Vec<KeyRow>, sqlx::Error> {
        let write = |table: &str, chosen: &str, same_row: &str| {
            let write = match change {
                KeyChange::Retry => format!(
                    "UPDATE {table} AS k SET status = 'failed', attempts = 0, updated_at = now() \
                     FROM {chosen}"
                ),
                KeyChange::Release => format!("DELETE FROM {table} AS k USING {chosen}"),
            };
            format!(
                "{write} WHERE {same_row} AND k.status IN ('failed', 'parked') AND NOT $5 \
                 RETURNING k.scope, k.key"
            )
        };
        let (table, timed) = (&self.table, self.timed_table());
        let plain_write = write(
            table,
            "chosen",
            "k.scope = chosen.scope AND k.key = chosen.key",
        );
        // A timed key's row is named with its fact time: the one bucket that holds it.
        let timed_write = write(
            timed,
            "chosen_timed",
            "k.scope = chosen_timed.scope AND k.key = chosen_timed.key \
             AND k.fact_time = chosen_timed.fact_time",
        );
        // The rows as they are, locked (`SKIP LOCKED`: a key that a delivery is retrying
        // right now is left to it), then changed in the same statement.
        let statement = format!(
            "WITH chosen AS ( \
                SELECT {PLAIN_COLUMNS} FROM {table} WHERE {SELECTION} \
                ORDER BY scope, key FOR UPDATE SKIP LOCKED), \
             chosen_timed AS ( \
                SELECT {TIMED_COLUMNS} FROM {timed} WHERE {SELECTION} \
                ORDER BY scope, key FOR UPDATE SKIP LOCKED), \
             changed AS ({plain_write}), \
             changed_timed AS ({timed_write}) \
             SELECT chosen.* FROM chosen \
             WHERE $5 OR EXISTS (SELECT FROM changed \
                                 WHERE changed.scope = chosen.scope AND changed.key = chosen.key) \
             UNION ALL \
             SELECT chosen_timed.* FROM chosen_timed \
             WHERE $5 OR EXISTS (SELECT FROM changed_timed \
                                 WHERE changed_timed.scope = chosen_timed.scope \
                                   AND changed_timed.key = chosen_timed.key) \
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

    /// Keys per scope and status in both tables, by scope then status, with the oldest
    /// last change among them and, for the keys kept by their fact's time, the oldest
    /// and newest fact (a full scan of both tables).
    pub(crate) async fn status_counts(
        &self,
        pool: &PgPool,
    ) -> Result<Vec<StatusCount>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT scope, status, count(*) AS count, min(updated_at) AS oldest, \
                        false AS timed, NULL::timestamptz AS oldest_fact, \
                        NULL::timestamptz AS newest_fact \
                 FROM {} GROUP BY scope, status \
                 UNION ALL \
                 SELECT scope, status, count(*), min(updated_at), true, min(fact_time), \
                        max(fact_time) \
                 FROM {} GROUP BY scope, status \
                 ORDER BY scope, status",
                self.table,
                self.timed_table(),
            ),
            &[],
        )
        .fetch_all_as(pool)
        .await
    }

    /// The lease in progress taken longest ago, in either table: its scope, key, when it
    /// was taken, when it expires and whether it has expired.
    pub(crate) async fn oldest_lease(
        &self,
        pool: &PgPool,
    ) -> Result<Option<OldestLeaseRow>, sqlx::Error> {
        let lease = "SELECT scope, key, updated_at AS since, lease_expires_at AS expires_at, \
                            coalesce(lease_expires_at <= now(), false) AS expired";
        self.query(
            &format!(
                "({lease} FROM {} WHERE status = 'processing' ORDER BY updated_at LIMIT 1) \
                 UNION ALL \
                 ({lease} FROM {} WHERE status = 'processing' ORDER BY updated_at LIMIT 1) \
                 ORDER BY since LIMIT 1",
                self.table,
                self.timed_table(),
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

    /// The time buckets, oldest first, with the catalog's estimate of their rows (no
    /// count: `reltuples`, as the last `VACUUM` or `ANALYZE` left it; `None` before the
    /// first) and their size on disk.
    pub(crate) async fn time_buckets(&self, pool: &PgPool) -> Result<Vec<TimeBucket>, sqlx::Error> {
        let timed = self.timed_table();
        self.query(
            &format!(
                "SELECT b.name, b.starts_at, b.ends_at, \
                        CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END AS estimated_rows, \
                        coalesce(pg_total_relation_size(c.oid), 0) AS bytes \
                 FROM {buckets} AS b \
                 LEFT JOIN (pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid) \
                   ON i.inhparent = $1::regclass AND c.relname = b.name \
                 ORDER BY b.starts_at",
                buckets = self.in_schema("idem_timed_buckets"),
            ),
            &[timed.into()],
        )
        .fetch_all_as(pool)
        .await
    }

    /// How many time buckets there are, the start of the oldest and the end of the
    /// newest: one read of the buckets' register, cheap enough for every upkeep.
    pub(crate) async fn bucket_span(&self, pool: &PgPool) -> Result<BucketSpan, sqlx::Error> {
        self.query(
            &format!(
                "SELECT count(*) AS buckets, min(starts_at) AS oldest, max(ends_at) AS newest_end \
                 FROM {}",
                self.in_schema("idem_timed_buckets")
            ),
            &[],
        )
        .fetch_optional_as(pool)
        .await
        .map(|span| span.unwrap_or((0, None, None)))
    }

    /// The start of the oldest bucket that may still exist (every bucket before it
    /// expired, and its facts are refused): `None` while none has expired.
    pub(crate) async fn bucket_horizon(
        &self,
        pool: &PgPool,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT CASE WHEN isfinite(expired_before) THEN expired_before END \
                 FROM {}",
                self.in_schema("idem_timed_horizon")
            ),
            &[],
        )
        .fetch_optional(pool)
        .await?
        .map_or(Ok(None), |row| row.try_get(0))
    }

    /// What an upkeep of the buckets would do now, and does nothing: the ranges of the
    /// buckets it would make from now to `ahead` (one per `width`, where missing, as
    /// `idem_timed_bucket` makes them: aligned, clipped to their neighbours and to the
    /// horizon), and the buckets it would drop, whose facts are all older than the
    /// longest of `window` and the scopes' declared windows.
    pub(crate) async fn bucket_plan(
        &self,
        pool: &PgPool,
        width: Duration,
        ahead: Duration,
        window: Duration,
    ) -> Result<(Vec<BucketRange>, Vec<TimeBucket>), sqlx::Error> {
        let buckets = self.in_schema("idem_timed_buckets");
        let horizon = self.in_schema("idem_timed_horizon");
        let make = format!(
            "WITH h AS (SELECT expired_before AS horizon FROM {horizon}), \
             missing AS ( \
                SELECT at, date_bin($1::bigint * interval '1 millisecond', at, \
                                    timestamptz '2000-01-01 00:00:00+00') AS lo \
                FROM generate_series(now(), now() + $2::bigint * interval '1 millisecond', \
                                     $1::bigint * interval '1 millisecond') AS at, h \
                WHERE at >= h.horizon \
                  AND NOT EXISTS (SELECT FROM {buckets} AS b \
                                  WHERE b.starts_at <= at AND at < b.ends_at)) \
             SELECT DISTINCT \
                greatest(m.lo, h.horizon, \
                         (SELECT max(b.ends_at) FROM {buckets} AS b WHERE b.ends_at <= m.at)) \
                    AS starts_at, \
                least(m.lo + $1::bigint * interval '1 millisecond', \
                      (SELECT min(b.starts_at) FROM {buckets} AS b WHERE b.starts_at > m.at)) \
                    AS ends_at \
             FROM missing AS m, h \
             ORDER BY starts_at"
        );
        let to_make = self
            .query(&make, &[millis(width).into(), millis(ahead).into()])
            .fetch_all_as(pool)
            .await?;
        let expired_before: DateTime<Utc> = self
            .query(
                &format!(
                    "SELECT now() - greatest($1::bigint, (SELECT max(retention_ms) FROM {})) \
                                    * interval '1 millisecond'",
                    self.scopes_table
                ),
                &[millis(window).into()],
            )
            .fetch_one(pool)
            .await?
            .try_get(0)?;
        let to_drop = self
            .time_buckets(pool)
            .await?
            .into_iter()
            .filter(|bucket| bucket.ends_at <= expired_before)
            .collect();
        Ok((to_make, to_drop))
    }

    /// `name` in the configured schema.
    fn in_schema(&self, name: &str) -> String {
        let schema = self
            .table
            .strip_suffix(".idem_keys")
            .unwrap_or(self.table.as_str());
        format!("{schema}.{name}")
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

impl<'r> FromRow<'r, PgRow> for StatusCount {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(StatusCount {
            scope: row.try_get("scope")?,
            status: row.try_get("status")?,
            count: row.try_get("count")?,
            oldest: row.try_get("oldest")?,
            timed: row.try_get("timed")?,
            oldest_fact: row.try_get("oldest_fact")?,
            newest_fact: row.try_get("newest_fact")?,
        })
    }
}

impl<'r> FromRow<'r, PgRow> for TimeBucket {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(TimeBucket {
            name: row.try_get("name")?,
            starts_at: row.try_get("starts_at")?,
            ends_at: row.try_get("ends_at")?,
            estimated_rows: row.try_get("estimated_rows")?,
            bytes: row.try_get("bytes")?,
        })
    }
}

impl<'r> FromRow<'r, PgRow> for BucketRange {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(BucketRange {
            starts_at: row.try_get("starts_at")?,
            ends_at: row.try_get("ends_at")?,
        })
    }
}

/// [`Statements::bucket_span`]'s row: how many buckets there are, the start of the
/// oldest, the end of the newest.
pub(crate) type BucketSpan = (i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// [`Statements::oldest_lease`]'s row: scope, key, since, expires at, expired.
pub(crate) type OldestLeaseRow = (String, Uuid, DateTime<Utc>, Option<DateTime<Utc>>, bool);
