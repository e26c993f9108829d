//! The time buckets that hold the keys of handlers with `event_time` (see
//! [`time_buckets`](crate::time_buckets)): which exist, how far back and ahead they reach,
//! and what the next upkeep would make and drop.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::AdminError;
use crate::Idem;
use crate::retention::{PurgeReport, Retention};
use crate::store::{BucketRange, TimeBucket};

/// The time buckets of the configured schema, and how far they reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TimeBuckets {
    /// How many buckets exist.
    pub count: usize,
    /// The start of the oldest bucket: the oldest fact hour whose keys are kept.
    pub oldest: Option<DateTime<Utc>>,
    /// The end of the newest bucket: how far ahead buckets are made. A claim of a fact
    /// past it makes its bucket itself, in a short transaction of its own.
    pub newest_end: Option<DateTime<Utc>>,
    /// Facts before this time are refused as outside the window: their buckets expired
    /// and are never made again. `None` while no bucket has expired.
    pub horizon: Option<DateTime<Utc>>,
    /// The rows of all buckets as the catalog estimates them (buckets not estimated yet
    /// count none).
    pub estimated_rows: i64,
    /// Their size on disk, in bytes.
    pub bytes: i64,
    /// Every bucket, oldest first.
    pub buckets: Vec<TimeBucket>,
}

/// The time buckets of the configured schema: one read of their register and of the
/// catalog (no count over the keys).
pub async fn time_buckets(idem: &Idem) -> Result<TimeBuckets, AdminError> {
    let statements = idem.statements();
    let buckets = statements.time_buckets(idem.pool()).await?;
    let horizon = statements.bucket_horizon(idem.pool()).await?;
    Ok(TimeBuckets {
        count: buckets.len(),
        oldest: buckets.first().map(|bucket| bucket.starts_at),
        newest_end: buckets.iter().map(|bucket| bucket.ends_at).max(),
        horizon,
        estimated_rows: buckets.iter().filter_map(|b| b.estimated_rows).sum(),
        bytes: buckets.iter().map(|bucket| bucket.bytes).sum(),
        buckets,
    })
}

/// What a retention cleanup would do now ([`purge_plan`]), and does not.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct PurgePlan {
    /// The status table's keys that would be deleted, as
    /// [`Idem::purge_dry_run`](crate::Idem::purge_dry_run) counts them, with
    /// `buckets_made` and `buckets_dropped` set to the lengths of the lists below.
    #[serde(flatten)]
    pub report: PurgeReport,
    /// The time buckets that would be made ahead, where missing, oldest first.
    pub buckets_to_make: Vec<BucketRange>,
    /// The expired time buckets that would be dropped, each with all its keys, oldest
    /// first.
    pub buckets_to_drop: Vec<TimeBucket>,
}

/// What [`Idem::purge_with`](crate::Idem::purge_with) would do now with `retention`, and
/// changes nothing: the status table's keys it would delete, the time buckets it would
/// make ahead (from now to [`Retention::future_bound`], one per
/// [`Retention::bucket_width`], where missing) and those it would drop (whose facts are
/// all older than the longest of the window and the scopes' declared windows).
pub async fn purge_plan(idem: &Idem, retention: &Retention) -> Result<PurgePlan, AdminError> {
    let (report, buckets_to_make, buckets_to_drop) =
        crate::retention::plan(idem, retention).await?;
    Ok(PurgePlan {
        report,
        buckets_to_make,
        buckets_to_drop,
    })
}
