//! The statements of a delivery whose key is kept by its fact's time (`event_time`): the
//! same protocol as `delivery`, on `idem_timed_keys`, where each statement names the
//! fact's time so that it touches the one bucket that holds the key, and the claim
//! inserts only inside the scope's window. Also the buckets' upkeep: made ahead, made
//! on demand, expired whole.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use super::delivery::CLAIM_COLUMNS;
use super::{Statements, millis};

/// The most buckets a transaction makes: each one made holds some ten locks (the table,
/// its index, its TOAST table, the parent's) until the transaction ends, and
/// PostgreSQL's lock table, some 6,400 entries by default, is shared by every session of
/// the server.
pub(crate) const BUCKETS_A_TRANSACTION: i64 = 16;

/// The window a timed claim inserts in: the fact's time, and how far from the database
/// clock it may be, back (`window`, the scope's retention window) and ahead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FactWindow {
    /// The fact's time, to the microsecond.
    pub at: DateTime<Utc>,
    /// The scope's window, in milliseconds.
    pub window_ms: i64,
    /// The bound ahead of the database clock, in milliseconds.
    pub ahead_ms: i64,
}

/// What the database says of a fact's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bucket {
    /// It exists (made now, or before).
    Ready,
    /// The fact is older than its window, or than the buckets that expired.
    TooOld,
    /// The fact is further ahead of the database clock than the bound.
    TooNew,
}

/// The SQL of the timed statements, for one schema.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) table: String,
    pub(super) claim: String,
    pub(super) claim_reading: String,
    pub(super) takeover: String,
    pub(super) read: String,
    pub(super) record_failure: String,
    pub(super) park_committed: String,
    bucket: String,
    expire: String,
    prepare: String,
}

impl Sql {
    // One field per statement, each next to the comment that says why it is written so.
    pub(super) fn new(schema: &str) -> Self {
        let table = format!("{schema}.idem_timed_keys");
        // The fact's time inside the window, on the database clock: `$5` the time, `$6`
        // the window and `$7` the bound ahead, in milliseconds.
        let in_window = "($5::timestamptz >= now() - $6::bigint * interval '1 millisecond' \
                          AND $5::timestamptz < now() + $7::bigint * interval '1 millisecond')";
        let row = "k.scope = $1 AND k.key = $2 AND k.fact_time = $5";
        // What a claim or a takeover answers when it wrote nothing (`claimed` is empty):
        // the row in the way, with whether the fact is inside its window; without one, a
        // row saying that the fact is outside its window, if it is.
        let in_the_way = format!(
            "SELECT {CLAIM_COLUMNS}, true AS in_window FROM claimed \
             UNION ALL \
             SELECT NULL, k.status, k.attempts, k.fingerprint, k.result, k.last_error, {in_window} \
             FROM {table} AS k WHERE {row} AND NOT EXISTS (SELECT FROM claimed) \
             UNION ALL \
             SELECT NULL, NULL, NULL, NULL, NULL, NULL, false \
             WHERE NOT {in_window} AND NOT EXISTS (SELECT FROM claimed) \
               AND NOT EXISTS (SELECT FROM {table} AS k WHERE {row})"
        );
        let insert = format!(
            "INSERT INTO {table} AS k (scope, key, fact_time, status, attempts, fingerprint) \
             SELECT $1::text, $2::uuid, $5::timestamptz, 'success', 1, $3::bytea \
             WHERE {in_window} \
             ON CONFLICT (scope, key, fact_time) DO NOTHING"
        );
        let returning = "RETURNING pg_current_xact_id()::text::bigint AS xid, \
                         set_config('lock_timeout', $4, true) AS restored";
        Sql {
            // A new key inside its window is one insert into its fact's bucket; outside
            // the window nothing is inserted, and the takeover statement says why. A
            // bucket that does not exist fails the insert (23514), which the caller
            // answers by making it.
            claim: format!("{insert} {returning}"),
            // Where duplicates are not rare: the same insert, and a duplicate (or a fact
            // outside its window) answered by the same statement, as the takeover
            // answers it. No row back: the row in the way was committed while the
            // statement waited behind it, which the takeover then reads.
            claim_reading: format!("WITH claimed AS ({insert} {returning}) {in_the_way}"),
            // As the status table's: a `failed` key is taken over under its row lock, and
            // the row in the way is read otherwise, as the claim reads it.
            takeover: format!(
                "WITH claimed AS ( \
                    UPDATE {table} AS k \
                    SET status = 'success', attempts = k.attempts + 1, updated_at = now(), \
                        fingerprint = coalesce(k.fingerprint, $3) \
                    WHERE {row} AND k.status = 'failed' AND {in_window} \
                      AND ($3::bytea IS NULL OR k.fingerprint IS NULL OR k.fingerprint = $3) \
                    {returning}) {in_the_way}"
            ),
            // `$5` is the fact's time in every statement that names one row.
            read: format!(
                "SELECT status, attempts, fingerprint, result, last_error \
                 FROM {table} AS k WHERE k.scope = $1 AND k.key = $2 AND k.fact_time = $3"
            ),
            record_failure: format!(
                "INSERT INTO {table} AS k (scope, key, fact_time, status, attempts, fingerprint, last_error) \
                 VALUES ($1, $2, $5, CASE WHEN $6 <= 1 THEN 'parked' ELSE 'failed' END, 1, $3, $4) \
                 ON CONFLICT (scope, key, fact_time) DO UPDATE \
                 SET attempts = k.attempts + 1, \
                     status = CASE WHEN k.attempts + 1 >= $6 THEN 'parked' ELSE 'failed' END, \
                     last_error = EXCLUDED.last_error, updated_at = now(), \
                     fingerprint = coalesce(k.fingerprint, EXCLUDED.fingerprint) \
                 WHERE k.status = 'failed' \
                 RETURNING attempts, status"
            ),
            park_committed: format!(
                "UPDATE {table} AS k SET status = 'parked', last_error = $4, updated_at = now() \
                 WHERE {row} AND k.xmin = xid($3::text::xid8)"
            ),
            bucket: format!(
                "SELECT {schema}.idem_timed_bucket($1, $2::bigint * interval '1 millisecond', $3, $4)"
            ),
            // The longest of the caller's windows and those the scopes' handlers declare.
            expire: format!(
                "SELECT {schema}.idem_timed_expire( \
                    greatest($1::bigint, (SELECT max(retention_ms) FROM {schema}.idem_scopes)), $2)"
            ),
            // The buckets of the cells of width `$1` ms from the one holding now (by now
            // itself: its start is past), steps `$3` to `$4` of them, made where missing
            // up to `$2` ms ahead. The cells are aligned as the bucket function aligns
            // them, so that the runs of steps of successive transactions leave no cell
            // between them.
            prepare: format!(
                "SELECT count(*) FILTER (WHERE made = 'created') FROM ( \
                    SELECT {schema}.idem_timed_bucket( \
                        greatest(now(), date_bin($1::bigint * interval '1 millisecond', now(), \
                                                 timestamptz '2000-01-01 00:00:00+00') \
                                        + step * $1::bigint * interval '1 millisecond'), \
                        $1::bigint * interval '1 millisecond', 1, $2 + 1) AS made \
                    FROM generate_series($3::bigint, least($4::bigint, $2::bigint / $1::bigint + 1)) AS step) AS made"
            ),
            table,
        }
    }
}

impl Statements {
    /// Whether `error` is the insert of a fact whose bucket does not exist.
    pub(crate) fn is_missing_bucket(error: &sqlx::Error) -> bool {
        error.as_database_error().is_some_and(|db| {
            db.code().as_deref() == Some("23514")
                && db.table() == Some("idem_timed_keys")
                && db.constraint().is_none()
        })
    }

    /// Makes the bucket of `fact` unless it exists or the fact is outside its window
    /// (one statement, its own transaction, on `pool`).
    pub(crate) async fn make_bucket(
        &self,
        pool: &PgPool,
        fact: FactWindow,
        width: std::time::Duration,
    ) -> Result<Bucket, sqlx::Error> {
        let row = self
            .query(
                &self.timed.bucket,
                &[
                    fact.at.into(),
                    millis(width).into(),
                    fact.window_ms.into(),
                    fact.ahead_ms.into(),
                ],
            )
            .fetch_one(pool)
            .await?;
        Ok(match row.try_get::<&str, _>(0)? {
            "too_old" => Bucket::TooOld,
            "too_new" => Bucket::TooNew,
            _ => Bucket::Ready,
        })
    }

    /// Makes the buckets from now to `ahead` that are missing (the one holding
    /// `now() + ahead` included): how many were made. A few buckets a transaction
    /// ([`BUCKETS_A_TRANSACTION`]): each one made takes some ten locks until its
    /// transaction ends, and PostgreSQL's lock table is shared by the whole server.
    pub(crate) async fn prepare_buckets(
        &self,
        pool: &PgPool,
        width: std::time::Duration,
        ahead: std::time::Duration,
    ) -> Result<u64, sqlx::Error> {
        let (width, ahead) = (millis(width).max(1), millis(ahead));
        // The cell holding now, and those up to the one holding `now + ahead`.
        let steps = ahead / width + 1;
        let mut made = 0;
        let mut first = 0;
        while first <= steps {
            let last = first.saturating_add(BUCKETS_A_TRANSACTION - 1);
            let row = self
                .query(
                    &self.timed.prepare,
                    &[width.into(), ahead.into(), first.into(), last.into()],
                )
                .fetch_one(pool)
                .await?;
            made += u64::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0);
            first = last.saturating_add(1);
        }
        Ok(made)
    }

    /// Drops the oldest bucket whose facts are all older than `window`: its name, or
    /// `None` when there is none. Waits for the parent's lock at most `lock_timeout`.
    pub(crate) async fn expire_bucket(
        &self,
        pool: &PgPool,
        window: std::time::Duration,
        lock_timeout: std::time::Duration,
    ) -> Result<Option<String>, sqlx::Error> {
        let lock_timeout_ms = i32::try_from(lock_timeout.as_millis()).unwrap_or(i32::MAX);
        let row = self
            .query(
                &self.timed.expire,
                &[millis(window).into(), lock_timeout_ms.max(1).into()],
            )
            .fetch_one(pool)
            .await?;
        row.try_get(0)
    }

    /// The timed table's name, for the commit's `UPDATE` of a result.
    pub(super) fn timed_table(&self) -> &str {
        &self.timed.table
    }

    /// Reads a timed key's row on `conn` (one statement, no transaction block).
    pub(super) async fn read_timed(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: uuid::Uuid,
        at: DateTime<Utc>,
    ) -> Result<Option<PgRow>, sqlx::Error> {
        self.query(&self.timed.read, &[scope.into(), key.into(), at.into()])
            .fetch_optional(conn)
            .await
    }
}
