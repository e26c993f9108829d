//! Operating the status table and the time-bucketed table of handlers with `event_time`:
//! the reads and changes an operator makes, as functions.
//!
//! The `idem` command line (crate `idem-cli`) is a thin shell over this module; a
//! service's own admin endpoints can call it the same way. Every function takes the
//! runtime handle of the status table ([`Idem`](crate::Idem)), whose schema it uses.
//!
//! - [`migration_status`] and [`ensure_migrated`]: whether the status table is there and
//!   up to date;
//! - [`show_key`], [`list_keys`]: rows of the status table and of the time buckets (a
//!   key kept by its fact's time is found by scope and key, and shows its
//!   [`fact_time`](KeyRow::fact_time)), as [`KeyRow`];
//! - [`retry_keys`]: `failed` and `parked` keys get a fresh count of attempts, and the
//!   next delivery runs the body again (as [`Idem::reset`](crate::Idem::reset));
//! - [`release_keys`]: `failed` and `parked` keys are deleted: the next delivery is a first
//!   delivery, whatever its payload (the recorded fingerprint goes with the row);
//! - [`stats`]: counts per scope and status, the oldest lease in progress, the table's
//!   size, the time buckets;
//! - [`time_buckets`]: the time buckets, how far back and ahead they reach, the horizon
//!   before which facts are refused, each bucket's estimated rows (from the catalog);
//! - [`purge_plan`]: what a retention cleanup would do now: the keys it would delete and
//!   the time buckets it would make and drop;
//! - [`scopes`] and [`release_scope`]: the scopes recorded, as [`ScopeInfo`] (owner, key
//!   definition, a declared key change and its last use), and forgetting one;
//! - [`KeyField`] and [`key_from_fields`]: a key from field values as a producer gives
//!   them, derived as `#[idempotent]` derives it.
//!
//! Retrying and releasing keys work on both tables alike.
//!
//! Purging old `success` keys is [`Idem::purge_with`](crate::Idem::purge_with) (see [`retention`](crate::retention)).

use uuid::Uuid;

use crate::key::KeyError;

mod buckets;
mod fields;
mod keys;
mod migrations;
mod scopes;
mod stats;

pub use crate::store::{BucketRange, KeyFilter, KeyRow, StatusCount, TimeBucket};
pub use buckets::{PurgePlan, TimeBuckets, purge_plan, time_buckets};
pub use fields::{FieldValue, KeyField, key_from_fields};
pub use keys::{Change, Cursor, list_keys, release_keys, retry_keys, show_key};
pub use migrations::{MigrationState, ensure_migrated, migration_status};
pub use scopes::{ScopeInfo, release_scope, scopes};
pub use stats::{OldestLease, ScopeWindow, Stats, stats};

/// Why an operator's request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The database refused or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema has no status table, or migrations are pending.
    #[error(
        "the status table in schema `{schema}` is not migrated ({pending} migration(s) pending): run `idem migrate` (or `Idem::migrate`) first, or give the right `--schema`"
    )]
    NotMigrated {
        /// The configured schema.
        schema: String,
        /// Migrations not applied yet.
        pending: usize,
    },
    /// No row for this key in this scope.
    #[error("no key {key} in scope `{scope}`")]
    UnknownKey {
        /// The scope asked for.
        scope: String,
        /// The key asked for.
        key: Uuid,
    },
    /// The key exists but its status does not allow the change.
    #[error(
        "key {key} in scope `{scope}` is `{status}`: only `failed` and `parked` keys can be retried or released"
    )]
    WrongStatus {
        /// The key's scope.
        scope: String,
        /// The key.
        key: Uuid,
        /// Its status.
        status: String,
    },
    /// A filter that cannot select what was asked.
    #[error("invalid selection: {0}")]
    InvalidSelection(String),
    /// Key field values that do not make a key.
    #[error("invalid key field: {0}")]
    KeyField(String),
    /// A key that cannot be derived from the fields.
    #[error(transparent)]
    Key(#[from] KeyError),
}
