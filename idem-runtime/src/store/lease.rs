//! The statements of lease mode: the claim under a lease, its extension and its end, on
//! the status table or, for a handler that keeps its keys by the fact's time, on the
//! fact's bucket of the timed table (each statement names the fact's time, and the claim
//! inserts or takes over only inside the fact's window). Expiries are computed and
//! compared on the database's clock only.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::sql::Value;
use super::timed::FactWindow;
use super::{Existing, Statements, Status, attempts_value, existing, failure_recorded, millis};

/// What a lease claim found.
#[derive(Debug)]
pub(crate) enum LeaseClaim {
    /// This worker holds the lease; `attempt` counts this execution.
    Won { attempt: u32 },
    /// The key exists and is not claimable now.
    Existing(Existing),
    /// A key kept by its fact's time: the fact is outside its window, and no final row
    /// of it is left to answer it.
    Outside,
}

/// What the table holds of a lease's key.
enum LeaseRow {
    /// No row, the fact inside its window (or in the status table).
    Missing,
    /// No row, and the fact outside its window.
    Outside,
    /// The key's row: whether its lease expired, and whether the fact is inside its
    /// window (always, in the status table).
    Found {
        existing: Existing,
        expired: bool,
        in_window: bool,
    },
}

/// The SQL of lease mode: on the status table, and on the time buckets.
#[derive(Debug)]
pub(super) struct Sql {
    plain: TableSql,
    timed: TableSql,
}

impl Sql {
    /// `table` the status table, `timed` the table of the keys kept by the fact's time.
    pub(super) fn new(table: &str, timed: &str) -> Self {
        Sql {
            plain: TableSql::new(table, false),
            timed: TableSql::new(timed, true),
        }
    }

    /// The statements of the table that holds a key of `fact_time`.
    fn of(&self, fact_time: Option<DateTime<Utc>>) -> &TableSql {
        match fact_time {
            Some(_) => &self.timed,
            None => &self.plain,
        }
    }
}

/// The SQL of lease mode, for one table: `idem_keys`, or `idem_timed_keys` where every
/// statement names the fact's time too, so that it touches the one bucket that holds the
/// key.
#[derive(Debug)]
struct TableSql {
    claim_lease: String,
    read_lease: String,
    park_expired: String,
    extend_lease: String,
    complete_lease: String,
    release_lease: String,
    fail_lease: String,
}

impl TableSql {
    // One field per statement, each next to the comment that says why it is written so.
    fn new(table: &str, timed: bool) -> Self {
        // The row's bucket: the fact's time as parameter `$n`, for the timed table.
        let at = |n: u8| {
            if timed {
                format!(" AND k.fact_time = ${n}")
            } else {
                String::new()
            }
        };
        // The fact's time `$7` inside its window `$8` back and `$9` ahead of the
        // database clock; true for the status table.
        let in_window = if timed {
            "($7::timestamptz >= now() - $8::bigint * interval '1 millisecond' \
              AND $7::timestamptz < now() + $9::bigint * interval '1 millisecond')"
        } else {
            "true"
        };
        let (columns, values, conflict) = if timed {
            (
                "scope, key, fact_time, status, attempts, fingerprint, lease_owner, lease_expires_at",
                format!(
                    "SELECT $1::text, $2::uuid, $7::timestamptz, 'processing', 1, $3::bytea, $4::uuid, \
                            now() + $5::bigint * interval '1 millisecond' WHERE {in_window}"
                ),
                "scope, key, fact_time",
            )
        } else {
            (
                "scope, key, status, attempts, fingerprint, lease_owner, lease_expires_at",
                "VALUES ($1, $2, 'processing', 1, $3, $4, now() + $5 * interval '1 millisecond')"
                    .to_owned(),
                "scope, key",
            )
        };
        TableSql {
            // A fact outside its window is neither inserted nor taken over (a timed key):
            // the read that follows says why.
            claim_lease: format!(
                "INSERT INTO {table} AS k ({columns}) {values} \
                 ON CONFLICT ({conflict}) DO UPDATE \
                 SET status = 'processing', attempts = k.attempts + 1, \
                     lease_owner = EXCLUDED.lease_owner, lease_expires_at = EXCLUDED.lease_expires_at, \
                     fingerprint = coalesce(k.fingerprint, EXCLUDED.fingerprint), \
                     updated_at = now() \
                 WHERE (k.status = 'failed' \
                        OR (k.status = 'processing' AND k.lease_expires_at <= now() AND k.attempts < $6)) \
                   AND (k.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL \
                        OR k.fingerprint = EXCLUDED.fingerprint) \
                   AND {in_window} \
                 RETURNING k.attempts"
            ),
            // The timed table's read is one row, with or without the key's: whether the
            // fact is inside its window (`$3` to `$5`).
            read_lease: if timed {
                format!(
                    "SELECT k.status, k.attempts, k.fingerprint, k.result, k.last_error, \
                            coalesce(k.lease_expires_at <= now(), false) AS expired, \
                            ($3::timestamptz >= now() - $4::bigint * interval '1 millisecond' \
                             AND $3::timestamptz < now() + $5::bigint * interval '1 millisecond') AS in_window \
                     FROM (SELECT) AS one \
                     LEFT JOIN {table} AS k ON k.scope = $1 AND k.key = $2 AND k.fact_time = $3"
                )
            } else {
                format!(
                    "SELECT status, attempts, fingerprint, result, last_error, \
                            coalesce(lease_expires_at <= now(), false) AS expired, true AS in_window \
                     FROM {table} AS k WHERE scope = $1 AND key = $2"
                )
            },
            // A lease that expired as often as `max_attempts` allows: its worker keeps dying.
            // Only then: a claim can also miss an expired lease that has attempts left (a
            // payload mismatch, or a lease that expired after the claim statement looked).
            park_expired: format!(
                "UPDATE {table} AS k SET status = 'parked', lease_expires_at = NULL, updated_at = now(), \
                     last_error = coalesce(last_error, 'the lease expired before the handler completed') \
                 WHERE scope = $1 AND key = $2{} AND status = 'processing' AND lease_expires_at <= now() \
                   AND attempts >= $3 \
                 RETURNING attempts, last_error",
                at(4)
            ),
            extend_lease: format!(
                "UPDATE {table} AS k SET lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now() \
                 WHERE scope = $1 AND key = $2{} AND lease_owner = $3 AND status = 'processing'",
                at(5)
            ),
            // Also true for this lease's own success recorded already: a completion sent
            // again after its connection was lost, the first one having committed.
            complete_lease: format!(
                "UPDATE {table} AS k SET status = 'success', result = $4::text::json, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2{} AND lease_owner = $3 \
                   AND (status = 'processing' OR (status = 'success' AND lease_expires_at IS NULL))",
                at(5)
            ),
            // A failure that is not the message's: the lease goes, and so does the attempt
            // its claim counted.
            release_lease: format!(
                "UPDATE {table} AS k SET status = 'failed', attempts = greatest(attempts - 1, 0), \
                     last_error = $4, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2{} AND lease_owner = $3 AND status = 'processing' \
                 RETURNING attempts, status",
                at(5)
            ),
            fail_lease: format!(
                "UPDATE {table} AS k SET status = CASE WHEN attempts >= $5 THEN 'parked' ELSE 'failed' END, \
                     last_error = $4, lease_expires_at = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2{} AND lease_owner = $3 AND status = 'processing' \
                 RETURNING attempts, status",
                at(6)
            ),
        }
    }
}

/// A lease's key: its scope and key, and, where it is kept by the fact's time, the fact's
/// time and its window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseKey<'a> {
    pub scope: &'a str,
    pub key: Uuid,
    pub time: Option<FactWindow>,
}

impl<'a> LeaseKey<'a> {
    /// `values` followed by the fact's time, where the key is kept by it: the values of
    /// the statements that name one row.
    fn with_time(&self, mut values: Vec<Value<'a>>) -> Vec<Value<'a>> {
        values.extend(self.time.map(|time| Value::from(time.at)));
        values
    }

    /// `values` followed by the fact's time and its window, where the key is kept by it.
    fn with_window(&self, mut values: Vec<Value<'a>>) -> Vec<Value<'a>> {
        if let Some(time) = self.time {
            values.extend([
                Value::from(time.at),
                Value::from(time.window_ms),
                Value::from(time.ahead_ms),
            ]);
        }
        values
    }

    fn fact_time(&self) -> Option<DateTime<Utc>> {
        self.time.map(|time| time.at)
    }
}

impl Statements {
    /// The row of `lease`'s key when it decides a lease-mode delivery without a claim:
    /// `success`, `parked`, or a lease that has not expired. A plain read: no lock, no
    /// wait, no write.
    pub(crate) async fn settled_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
    ) -> Result<Option<Existing>, sqlx::Error> {
        let LeaseRow::Found {
            existing, expired, ..
        } = self.read_lease(conn, lease).await?
        else {
            return Ok(None);
        };
        Ok(match existing.status {
            Status::Success | Status::Parked => Some(existing),
            Status::Processing if !expired => Some(existing),
            Status::Processing | Status::Failed => None,
        })
    }

    /// What the table holds of `lease`'s key.
    async fn read_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
    ) -> Result<LeaseRow, sqlx::Error> {
        let sql = &self.lease.of(lease.fact_time()).read_lease;
        let values = lease.with_window(vec![lease.scope.into(), lease.key.into()]);
        let Some(row) = self.query(sql, &values).fetch_optional(conn).await? else {
            return Ok(LeaseRow::Missing);
        };
        let in_window: bool = row.try_get("in_window")?;
        if row.try_get::<Option<&str>, _>("status")?.is_none() {
            // The timed read's row without a key.
            return Ok(if in_window {
                LeaseRow::Missing
            } else {
                LeaseRow::Outside
            });
        }
        Ok(LeaseRow::Found {
            existing: existing(&row)?,
            expired: row.try_get("expired")?,
            in_window,
        })
    }

    /// Claims `lease`'s key under a lease, or reads the row that is in the way.
    pub(crate) async fn claim_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
        fingerprint: Option<&[u8]>,
        token: Uuid,
        duration: Duration,
        max_attempts: u32,
    ) -> Result<LeaseClaim, sqlx::Error> {
        let sql = self.lease.of(lease.fact_time());
        let values = lease.with_window(vec![
            lease.scope.into(),
            lease.key.into(),
            fingerprint.into(),
            token.into(),
            millis(duration).into(),
            attempts_value(max_attempts),
        ]);
        let won = self
            .query(&sql.claim_lease, &values)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = won {
            let attempt = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
            return Ok(LeaseClaim::Won { attempt });
        }
        let (mut existing, expired, in_window) = match self.read_lease(conn, lease).await? {
            LeaseRow::Found {
                existing,
                expired,
                in_window,
            } => (existing, expired, in_window),
            LeaseRow::Outside => return Ok(LeaseClaim::Outside),
            LeaseRow::Missing => {
                // Purged between the two statements: an empty table again.
                return Box::pin(self.claim_lease(
                    conn,
                    lease,
                    fingerprint,
                    token,
                    duration,
                    max_attempts,
                ))
                .await;
            }
        };
        if existing.status == Status::Processing && expired {
            // Expired, and not reclaimed above: park it if it used up its attempts.
            let values = lease.with_time(vec![
                lease.scope.into(),
                lease.key.into(),
                attempts_value(max_attempts),
            ]);
            if let Some(row) = self
                .query(&sql.park_expired, &values)
                .fetch_optional(&mut *conn)
                .await?
            {
                existing.status = Status::Parked;
                existing.attempts = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
                existing.last_error = row.try_get("last_error")?;
            }
        }
        // A fact outside its window is not run again: neither a failed key nor an
        // expired lease (`success` and `parked` still answer it).
        let claimable =
            existing.status == Status::Failed || (existing.status == Status::Processing && expired);
        if !in_window && claimable {
            return Ok(LeaseClaim::Outside);
        }
        Ok(LeaseClaim::Existing(existing))
    }

    /// Moves the lease's expiry to `duration` from now; `false` when it is no longer ours.
    pub(crate) async fn extend_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
        token: Uuid,
        duration: Duration,
    ) -> Result<bool, sqlx::Error> {
        let values = lease.with_time(vec![
            lease.scope.into(),
            lease.key.into(),
            token.into(),
            millis(duration).into(),
        ]);
        let done = self
            .query(&self.lease.of(lease.fact_time()).extend_lease, &values)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks the key `success` if the lease is still ours; `false` when it is not.
    pub(crate) async fn complete_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
        token: Uuid,
        result: Option<&serde_json::Value>,
    ) -> Result<bool, sqlx::Error> {
        let result = result.map(serde_json::Value::to_string);
        let values = lease.with_time(vec![
            lease.scope.into(),
            lease.key.into(),
            token.into(),
            result.as_deref().into(),
        ]);
        let done = self
            .query(&self.lease.of(lease.fact_time()).complete_lease, &values)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a failure if the lease is still ours: the attempts and whether the key is
    /// now parked, or `None` when the lease is lost.
    pub(crate) async fn fail_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
        token: Uuid,
        error: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let values = lease.with_time(vec![
            lease.scope.into(),
            lease.key.into(),
            token.into(),
            error.into(),
            attempts_value(max_attempts),
        ]);
        let sql = &self.lease.of(lease.fact_time()).fail_lease;
        let row = self.query(sql, &values).fetch_optional(conn).await?;
        row.as_ref().map(failure_recorded).transpose()
    }

    /// Releases the lease without the attempt its claim counted (a failure that is not
    /// the message's), if it is still ours: the attempts, or `None` when the lease is lost.
    pub(crate) async fn release_lease(
        &self,
        conn: &mut PgConnection,
        lease: LeaseKey<'_>,
        token: Uuid,
        error: &str,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let values = lease.with_time(vec![
            lease.scope.into(),
            lease.key.into(),
            token.into(),
            error.into(),
        ]);
        let sql = &self.lease.of(lease.fact_time()).release_lease;
        let row = self.query(sql, &values).fetch_optional(conn).await?;
        row.as_ref().map(failure_recorded).transpose()
    }
}
