//! An overview of the status table and of the time-bucketed one: counts per scope and
//! status, the oldest lease, the tables' sizes, the time buckets, the retention windows
//! handlers declare.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::AdminError;
use super::buckets::{TimeBuckets, time_buckets};
use crate::Idem;
use crate::store::StatusCount;

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

/// An overview of the status table and of the time-bucketed table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Keys per scope and status, by scope then status, in both tables.
    pub counts: Vec<StatusCount>,
    /// Every key, in both tables.
    pub total: i64,
    /// The oldest lease in progress, if any.
    pub oldest_lease: Option<OldestLease>,
    /// The status table's size on disk with its indexes and TOAST, in bytes.
    pub table_bytes: i64,
    /// The scopes whose handlers declare a retention window of their own.
    pub windows: Vec<ScopeWindow>,
    /// Keys kept by their fact's time, in both tables' count above.
    pub timed_total: i64,
    /// The time buckets, how far back and ahead they reach, the horizon, and their
    /// estimated rows and size (see [`time_buckets`]).
    pub buckets: TimeBuckets,
}

/// Counts keys per scope and status (a full scan of the status table and of the time
/// buckets), finds the oldest lease in progress, the status table's size, the time
/// buckets (from their register and the catalog: [`time_buckets`]) and the retention
/// windows handlers declare.
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
    let buckets = time_buckets(idem).await?;
    Ok(Stats {
        total: counts.iter().map(|count| count.count).sum(),
        timed_total: counts
            .iter()
            .filter(|count| count.timed)
            .map(|count| count.count)
            .sum(),
        counts,
        oldest_lease,
        table_bytes,
        windows,
        buckets,
    })
}
