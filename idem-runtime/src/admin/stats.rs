//! An overview of the status table: counts per scope and status, the oldest lease, the
//! table's size, the retention windows handlers declare.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::AdminError;
use crate::Idem;

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
}

/// The lease in progress that was taken longest ago.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OldestLease {
    /// Its scope.
    pub scope: String,
    /// Its key.
    pub key: Uuid,
    /// When it was taken (its last change).
    pub since: DateTime<Utc>,
    /// When it expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether it has expired (a worker died, or is late): the next delivery reclaims it.
    pub expired: bool,
}

/// A retention window that a scope's handler declares (`retention = "..."`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScopeWindow {
    /// The scope.
    pub scope: String,
    /// The window, in milliseconds.
    pub retention_ms: i64,
}

/// An overview of the status table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Keys per scope and status, by scope then status.
    pub counts: Vec<StatusCount>,
    /// Every key.
    pub total: i64,
    /// The oldest lease in progress, if any.
    pub oldest_lease: Option<OldestLease>,
    /// The table's size on disk with its indexes and TOAST, in bytes.
    pub table_bytes: i64,
    /// The scopes whose handlers declare a retention window of their own.
    pub windows: Vec<ScopeWindow>,
}

/// Counts keys per scope and status (a full scan of the status table), finds the oldest
/// lease in progress, the table's size and the retention windows handlers declare.
pub async fn stats(idem: &Idem) -> Result<Stats, AdminError> {
    let statements = idem.statements();
    let counts = statements.status_counts(idem.pool()).await?;
    let oldest_lease = statements.oldest_lease(idem.pool()).await?.map(
        |(scope, key, since, expires_at, expired)| OldestLease {
            scope,
            key,
            since,
            expires_at,
            expired,
        },
    );
    let table_bytes = statements.table_bytes(idem.pool()).await?;
    let windows = statements
        .scope_windows(idem.pool())
        .await?
        .into_iter()
        .map(|(scope, retention_ms)| ScopeWindow {
            scope,
            retention_ms,
        })
        .collect();
    let counts: Vec<StatusCount> = counts
        .into_iter()
        .map(|(scope, status, count, oldest)| StatusCount {
            scope,
            status,
            count,
            oldest,
        })
        .collect();
    Ok(Stats {
        total: counts.iter().map(|count| count.count).sum(),
        counts,
        oldest_lease,
        table_bytes,
        windows,
    })
}
