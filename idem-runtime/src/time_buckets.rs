//! Keys kept by the fact's own time: a status table that stays small and fast at any size.
//!
//! The status table `idem_keys` holds one row per fact until retention deletes it, and a
//! new key's insert costs more as the table grows: its primary key index outgrows memory,
//! and after each checkpoint every index page that a new key touches is written whole to
//! the WAL. Deleting old keys (`DELETE`) costs as much again.
//!
//! A handler whose key includes the fact's time can say so, and its keys are kept by that
//! time instead:
//!
//! ```
//! use chrono::{DateTime, Utc};
//! use idem_runtime::idempotent;
//! use sqlx::PgConnection;
//!
//! struct OrderEvent {
//!     order_id: String,
//!     event_type: String,
//!     occurred_at: DateTime<Utc>,
//! }
//!
//! #[idempotent(key = "order_id, event_type, occurred_at", event_time = "occurred_at")]
//! async fn apply(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), sqlx::Error> {
//!     # let _ = (tx, event);
//!     Ok(())
//! }
//! ```
//!
//! Every delivery and every re-send of one fact must carry the same time, to the
//! nanosecond: the key encodes the instant exactly (see [`key`](crate::key)). A producer
//! that stamps a fact once and sends that stamp every time does; one that re-reads the
//! time from a store of lower precision (PostgreSQL keeps microseconds, JSON and Kafka
//! timestamps often milliseconds) before a re-send must stamp the fact at that precision
//! in the first place. Then the fact's key
//! lives in exactly one *bucket*: a partition of the table `idem_timed_keys` holding the
//! facts of one hour ([`Retention::bucket_width`]). A claim names the fact's time, and
//! touches that bucket alone: a new key's index is the small index of the current hour,
//! whatever the table holds in all. `event_time` must be one of the `key` fields (a
//! compile error otherwise): a time outside the key would let a re-send with a new time
//! run again.
//!
//! # The window's edges
//!
//! A fact is claimed only while its time is inside its scope's retention window, on the
//! database clock: not older than the window ([`Retention::window_of`], else the
//! handler's `retention = "..."`, else the default), and not further ahead than
//! [`Retention::future_bound`] (an hour by default). A fact outside it gets
//! [`Error::OutsideWindow`](crate::Error::OutsideWindow) and does not run: its key may
//! have expired with its bucket, and running it could apply the fact twice. A consumer
//! dead-letters it (disposition `DeadLetter`), and the outcome is counted as
//! `idem_handlings_total{outcome="outside_window"}`. A duplicate of a fact whose key is
//! still kept is answered as a duplicate, wherever its time is.
//!
//! With the status table, a duplicate that arrives after retention deleted its key runs
//! again silently. Here the window's edge is visible instead.
//!
//! # Buckets: made ahead, expired whole
//!
//! The retention cleanup ([`Idem::purge`](crate::Idem::purge), `idem purge`, the task of
//! [`Idem::spawn_retention`](crate::Idem::spawn_retention)) keeps the buckets:
//!
//! - it makes the buckets from now to the future bound ahead, where missing; a claim
//!   that finds no bucket for its fact makes it too, in a short transaction of its own
//!   (creators take turns on an advisory lock; through PgBouncer in transaction pooling
//!   as well) and claims again;
//! - it drops each bucket whose newest fact is older than the longest window of the
//!   handle's settings and of the scopes' declared windows: `DETACH PARTITION` and
//!   `DROP TABLE`, in constant time and WAL, whatever the bucket holds. The detach waits
//!   for the table's lock at most 200 ms (claims wait for it that long at most, once per
//!   bucket); a busy table is tried again at the next run. A dropped bucket is never made
//!   again: the facts of its hour are refused as outside the window from then on, even
//!   by a process whose window is longer.
//!
//! Buckets are shared by the scopes of the schema, so a scope with a shorter window keeps
//! its keys as long as the longest window needs them: longer, never shorter. A fact is
//! still refused once its own scope's window has passed. The longest window is that of
//! the handle that runs the cleanup and the windows the scopes' handlers declare
//! (`retention = "..."`): a handler that needs a longer window than the cleaner's settings
//! declares it, so that no cleaner drops its buckets early.
//!
//! [`PurgeReport::buckets_dropped`](crate::retention::PurgeReport::buckets_dropped)
//! counts the buckets dropped, each with all its keys; `deleted` counts the keys deleted
//! row by row from the status table only. A dry run
//! ([`Idem::purge_dry_run`](crate::Idem::purge_dry_run)) counts the buckets it would make
//! and drop, and [`admin::purge_plan`](crate::admin::purge_plan) names them.
//!
//! Both are functions of the schema (`idem_timed_bucket`, `idem_timed_expire`, migrations
//! 0010 to 0012) owned by the role that migrated it (`SECURITY DEFINER`): a consumer's
//! role needs `EXECUTE` on `idem_timed_bucket` and no right to create tables, which
//! [`consumer_grants`](crate::privileges::consumer_grants) gives. Like `DELETE` on the
//! status table for a cleaner, `EXECUTE` on `idem_timed_expire` lets a role expire buckets,
//! so the consumer's grants leave it out: grant it to the role that runs the cleanup. The
//! function keeps the longest window the scopes declare whatever window its caller passes,
//! and refuses a negative window.
//!
//! # Lease mode, key changes and batches
//!
//! A lease-mode handler keeps its keys by the fact's time as a transaction-mode one does:
//! the lease's claim, extension, completion, failure and parking each name the fact's
//! time, and a fact outside its window is refused ([`Error::OutsideWindow`](crate::Error))
//! and never run, nor is a failed key or an expired lease whose fact left the window.
//!
//! Declaring `event_time` on a scope that has keys in the status table is a key change,
//! declared with `previous_key` (the key's fields as they were): a delivery claims the
//! status table's key first, then the key in the fact's bucket, in one transaction, so
//! that the builds before and after the move deliver each fact once between them. A
//! handler whose keys are kept by the fact's time changes its key with `previous_key`
//! and `previous_event_time` (its previous keys are in the fact's bucket too). Without
//! the declaration the change is refused ([`Error::KeyChanged`](crate::Error::KeyChanged)),
//! and so is removing `event_time` from a scope that has keys: give the handler a new
//! `scope`, and the old scope's keys expire with their window.
//!
//! Batches (`batch = true` and batch handlers) claim their keys with one statement as
//! they do in the status table, each key in its fact's bucket: a batch may span several
//! buckets, a claim that finds one missing makes the batch's buckets and claims again,
//! and a fact outside its window is refused alone while the rest of the batch runs (see
//! [`batch`](crate::batch)).

use std::time::Duration;

use crate::Idem;
use crate::config::retention::Retention;
pub use crate::config::retention::{DEFAULT_BUCKET_WIDTH, DEFAULT_FUTURE_BOUND};

/// How long the drop of a bucket waits for the table's lock.
const EXPIRY_LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// What one upkeep of the buckets did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Upkeep {
    pub(crate) made: u64,
    pub(crate) dropped: u64,
}

/// Makes the buckets ahead and drops the expired ones (see the module docs).
pub(crate) async fn upkeep(idem: &Idem, retention: &Retention) -> Result<Upkeep, sqlx::Error> {
    let statements = idem.statements();
    let width = retention.bucket_width_duration();
    let made = statements
        .prepare_buckets(idem.pool(), width, retention.future_bound_duration())
        .await?;
    let longest = retention.longest_window();
    let mut dropped = 0;
    loop {
        match statements
            .expire_bucket(idem.pool(), longest, EXPIRY_LOCK_TIMEOUT)
            .await
        {
            Ok(Some(bucket)) => {
                tracing::info!(bucket, "idem retention: an expired time bucket was dropped");
                dropped += 1;
            }
            Ok(None) => break,
            Err(error) if crate::transactional::is_lock_timeout(&error) => {
                tracing::info!(
                    "idem retention: the time buckets' table was busy; the expired bucket goes at the next run"
                );
                break;
            }
            Err(error) => return Err(error),
        }
    }
    crate::telemetry::buckets(made, dropped);
    match statements.bucket_span(idem.pool()).await {
        Ok((buckets, oldest, newest_end)) => {
            let schema = idem.config().schema().as_str();
            crate::telemetry::bucket_span(schema, buckets, oldest, newest_end);
        }
        Err(error) => tracing::warn!(%error, "idem retention: the time buckets could not be read"),
    }
    Ok(Upkeep { made, dropped })
}
