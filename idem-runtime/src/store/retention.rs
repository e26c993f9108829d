//! The statements of the retention cleanup ([`retention`](crate::retention)): its lock,
//! the deletion of a batch of expired `success` keys, and their count.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool, Postgres, Row, Transaction};

use super::{Statements, millis};
use crate::config::retention::Retention;

/// The SQL of the cleanup of one status table.
#[derive(Debug)]
pub(super) struct Sql {
    /// Deletes one batch of expired keys: `$1` the default window in ms, `$2`/`$3` the
    /// scopes with their own window, `$4` the batch's size.
    delete_batch: String,
    /// Counts the expired keys per scope, with `$1` to `$3` as above.
    count: String,
    /// The text of the advisory lock of the cleanup.
    lock: String,
}

/// The rows of the cleanup of one status table.
fn candidates(table: &str, scopes: &str) -> String {
    // `$1` the default window in ms, `$2`/`$3` the scopes with their own window in the
    // settings; then the window a scope's handler declared; then the default.
    format!(
        "FROM {table} AS k \
         LEFT JOIN (SELECT * FROM unnest($2::text[], $3::bigint[]) AS o(scope, window_ms)) AS o \
           ON o.scope = k.scope \
         LEFT JOIN {scopes} AS s ON s.scope = k.scope \
         WHERE k.status = 'success' \
           AND k.created_at < now() - least( \
                 $1::bigint, \
                 (SELECT min(w) FROM unnest($3::bigint[]) AS w), \
                 (SELECT min(retention_ms) FROM {scopes})) * interval '1 millisecond' \
           AND k.updated_at < now() - coalesce(o.window_ms, s.retention_ms, $1::bigint) \
                                      * interval '1 millisecond'"
    )
}

impl Sql {
    pub(super) fn new(table: &str, scopes: &str, schema: &str) -> Self {
        Sql {
            delete_batch: format!(
                "WITH doomed AS ( \
                    SELECT k.ctid {} \
                    LIMIT $4 FOR UPDATE OF k SKIP LOCKED), \
                 deleted AS ( \
                    DELETE FROM {table} AS k \
                    WHERE k.ctid = ANY(ARRAY(SELECT ctid FROM doomed)) AND k.status = 'success' \
                    RETURNING k.scope) \
                 SELECT scope, count(*) FROM deleted GROUP BY scope",
                candidates(table, scopes)
            ),
            count: format!(
                "SELECT k.scope, count(*) {} GROUP BY k.scope",
                candidates(table, scopes)
            ),
            lock: lock_name(schema),
        }
    }
}

/// The advisory lock key text of the cleanup of the status table in `schema`.
fn lock_name(schema: &str) -> String {
    format!("idem retention {schema}.idem_keys")
}

/// The windows of a cleanup as its statements take them: the default one, and the scopes
/// with a window of their own, in milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct Windows {
    default_ms: i64,
    scopes: Vec<String>,
    windows_ms: Vec<i64>,
}

impl Windows {
    /// The windows of `retention`.
    pub(crate) fn of(retention: &Retention) -> Self {
        let (scopes, windows_ms) = retention
            .scopes
            .iter()
            .map(|(scope, window)| (scope.clone(), millis(*window)))
            .unzip();
        Windows {
            default_ms: millis(retention.window),
            scopes,
            windows_ms,
        }
    }
}

impl Statements {
    /// Takes the cleanup's session-level advisory lock on `conn`, if no other session
    /// holds it.
    pub(crate) async fn try_lock_cleanup(
        &self,
        conn: &mut PgConnection,
    ) -> Result<bool, sqlx::Error> {
        self.query(
            "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
            &[self.retention.lock.as_str().into()],
        )
        .fetch_one(conn)
        .await?
        .try_get(0)
    }

    /// Gives the cleanup's session-level advisory lock back.
    pub(crate) async fn unlock_cleanup(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        self.query(
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
            &[self.retention.lock.as_str().into()],
        )
        .execute(conn)
        .await
        .map(drop)
    }

    /// Begins the transaction of one batch, its statements bounded by `timeout`.
    pub(crate) async fn begin_cleanup_batch<'c>(
        &self,
        conn: &'c mut PgConnection,
        timeout: Duration,
    ) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
        let begin = format!(
            "BEGIN; SET LOCAL statement_timeout = '{}ms'",
            millis(timeout)
        );
        conn.begin_with(begin).await
    }

    /// Takes the cleanup's lock for the caller's transaction (behind a transaction
    /// pooler, where no session outlives a transaction), if no one holds it.
    pub(crate) async fn try_lock_cleanup_batch(
        &self,
        conn: &mut PgConnection,
    ) -> Result<bool, sqlx::Error> {
        self.query(
            "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
            &[self.retention.lock.as_str().into()],
        )
        .fetch_one(conn)
        .await?
        .try_get(0)
    }

    /// Deletes up to `batch_size` expired `success` keys in the caller's transaction: the
    /// keys deleted per scope.
    pub(crate) async fn delete_expired(
        &self,
        conn: &mut PgConnection,
        windows: &Windows,
        batch_size: u32,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        self.query(
            &self.retention.delete_batch,
            &[
                windows.default_ms.into(),
                windows.scopes.as_slice().into(),
                windows.windows_ms.as_slice().into(),
                i64::from(batch_size).into(),
            ],
        )
        .fetch_all_as(conn)
        .await
    }

    /// The expired `success` keys per scope, deleting nothing.
    pub(crate) async fn count_expired(
        &self,
        pool: &PgPool,
        windows: &Windows,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        self.query(
            &self.retention.count,
            &[
                windows.default_ms.into(),
                windows.scopes.as_slice().into(),
                windows.windows_ms.as_slice().into(),
            ],
        )
        .fetch_all_as(pool)
        .await
    }
}
