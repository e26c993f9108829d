//! The reads of the testing kit ([`testing`](crate::testing)): the status table's rows as
//! a test sees them.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::Statements;

/// A row of the status table as the testing kit compares it between two moments: scope,
/// key, status, attempts, last change, lease owner, stored result (as text).
pub(crate) type SnapshotRow = (
    String,
    Uuid,
    String,
    i32,
    DateTime<Utc>,
    Option<Uuid>,
    Option<String>,
);

impl Statements {
    /// Every committed row of the status table and of the time buckets.
    pub(crate) async fn snapshot_rows(
        &self,
        pool: &PgPool,
    ) -> Result<Vec<SnapshotRow>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT scope, key, status, attempts, updated_at, lease_owner, result::text AS result \
                 FROM {} \
                 UNION ALL \
                 SELECT scope, key, status, attempts, updated_at, lease_owner, result::text AS result \
                 FROM {}",
                self.table,
                self.timed.table
            ),
            &[],
        )
        .fetch_all_as(pool)
        .await
    }

    /// The status of `key` in `scope` and whether its lease has expired on the database's
    /// clock (`None`: the row holds no lease); `None` without a row. In the status table or
    /// in the time buckets (a timed key's digest holds its fact's time: one row at most).
    pub(crate) async fn lease_state(
        &self,
        pool: &PgPool,
        scope: &str,
        key: Uuid,
    ) -> Result<Option<(String, Option<bool>)>, sqlx::Error> {
        self.query(
            &format!(
                "SELECT status, lease_expires_at <= now() FROM {} WHERE scope = $1 AND key = $2 \
                 UNION ALL \
                 SELECT status, lease_expires_at <= now() FROM {} WHERE scope = $1 AND key = $2 \
                 LIMIT 1",
                self.table, self.timed.table
            ),
            &[scope.into(), key.into()],
        )
        .fetch_optional_as(pool)
        .await
    }

    /// The name of the status table, for the testing kit's messages.
    pub(crate) fn table_name(&self) -> &str {
        &self.table
    }
}
