//! Operating the status table: the reads and changes an operator makes, as functions.
//!
//! The `idem` command line (crate `idem-cli`) is a thin shell over this module; a
//! service's own admin endpoints can call it the same way. Every function takes the
//! runtime handle of the status table ([`Idem`]), whose schema it uses.
//!
//! - [`migration_status`] and [`ensure_migrated`]: whether the status table is there and
//!   up to date;
//! - [`show_key`], [`list_keys`]: rows of the status table, as [`KeyRow`];
//! - [`retry_keys`]: `failed` and `parked` keys get a fresh count of attempts, and the
//!   next delivery runs the body again (as [`Idem::reset`]);
//! - [`release_keys`]: `failed` and `parked` keys are deleted: the next delivery is a first
//!   delivery, whatever its payload (the recorded fingerprint goes with the row);
//! - [`stats`]: counts per scope and status, the oldest lease in progress, the table's size;
//! - [`KeyField`] and [`key_from_fields`]: a key from field values as a producer gives
//!   them, derived as `#[idempotent]` derives it.
//!
//! Purging old `success` keys is [`Idem::purge_with`] (see [`retention`](crate::retention)).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::key::{IdempotencyKey, KeyError, KeyPart, key_of};
use crate::store::{KeyChange, Selection, Status};
use crate::{Idem, MIGRATOR};

pub use crate::store::KeyRow;

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

/// One migration of the status table and whether the schema has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MigrationState {
    /// Its version (the number in its file name).
    pub version: i64,
    /// Its description.
    pub description: String,
    /// Applied in the schema.
    pub applied: bool,
}

/// The migrations of the status table (from [`MIGRATOR`]) and which of them the configured
/// schema has. A schema that does not exist has none.
pub async fn migration_status(idem: &Idem) -> Result<Vec<MigrationState>, AdminError> {
    let applied = idem
        .statements()
        .applied_migrations(idem.pool(), idem.config().schema())
        .await?;
    Ok(MIGRATOR
        .iter()
        .filter(|migration| !migration.migration_type.is_down_migration())
        .map(|migration| MigrationState {
            version: migration.version,
            description: migration.description.to_string(),
            applied: applied.contains(&migration.version),
        })
        .collect())
}

/// Fails with [`AdminError::NotMigrated`] unless every migration is applied in the
/// configured schema.
pub async fn ensure_migrated(idem: &Idem) -> Result<(), AdminError> {
    let pending = migration_status(idem)
        .await?
        .iter()
        .filter(|migration| !migration.applied)
        .count();
    if pending == 0 {
        Ok(())
    } else {
        Err(AdminError::NotMigrated {
            schema: idem.config().schema().to_string(),
            pending,
        })
    }
}

/// The row of `key` in `scope`, or [`AdminError::UnknownKey`].
pub async fn show_key(idem: &Idem, scope: &str, key: Uuid) -> Result<KeyRow, AdminError> {
    idem.statements()
        .key_row(idem.pool(), scope, key)
        .await?
        .ok_or_else(|| AdminError::UnknownKey {
            scope: scope.to_owned(),
            key,
        })
}

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

    /// The filter as the store selects keys.
    fn selection(&self) -> Selection<'_> {
        Selection {
            scope: self.scope.as_deref(),
            key: self.key,
            statuses: &self.statuses,
            older_than: self.older_than,
        }
    }
}

/// A status as the status table writes it.
pub fn status_text(status: Status) -> &'static str {
    status.as_str()
}

/// A status from its text (`processing`, `success`, `failed`, `parked`).
pub fn parse_status(text: &str) -> Option<Status> {
    Status::parse(text).ok()
}

/// Where a page of [`list_keys`] starts: after this key, in `(scope, key)` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last scope of the previous page.
    pub scope: String,
    /// The last key of the previous page.
    pub key: Uuid,
}

impl Cursor {
    /// The cursor after `row`.
    pub fn after(row: &KeyRow) -> Self {
        Cursor {
            scope: row.scope.clone(),
            key: row.key,
        }
    }

    /// Parses `<scope>/<key>`, as [`Display`](std::fmt::Display) writes it.
    pub fn parse(text: &str) -> Option<Self> {
        let (scope, key) = text.rsplit_once('/')?;
        Some(Cursor {
            scope: scope.to_owned(),
            key: key.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.scope, self.key)
    }
}

/// Up to `limit` rows selected by `filter`, in `(scope, key)` order, after `after`.
/// The next page starts at [`Cursor::after`] the last row.
pub async fn list_keys(
    idem: &Idem,
    filter: &KeyFilter,
    after: Option<&Cursor>,
    limit: u32,
) -> Result<Vec<KeyRow>, AdminError> {
    Ok(idem
        .statements()
        .key_rows(
            idem.pool(),
            &filter.selection(),
            after.map(|cursor| (cursor.scope.as_str(), cursor.key)),
            limit,
        )
        .await?)
}

/// What [`retry_keys`] or [`release_keys`] did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Change {
    /// The keys changed, as they were before the change.
    pub keys: Vec<KeyRow>,
    /// A dry run: nothing was changed.
    pub dry_run: bool,
}

/// The statuses a retry or a release may change: `failed` and `parked` (the default).
fn releasable(filter: &KeyFilter) -> Result<KeyFilter, AdminError> {
    let mut filter = filter.clone();
    if filter.key.is_some() && filter.scope.is_none() {
        return Err(AdminError::InvalidSelection(
            "a key is selected with its scope".to_owned(),
        ));
    }
    if filter.statuses.is_empty() {
        filter.statuses = vec![Status::Failed, Status::Parked];
    }
    if let Some(status) = filter
        .statuses
        .iter()
        .find(|status| !matches!(status, Status::Failed | Status::Parked))
    {
        return Err(AdminError::InvalidSelection(format!(
            "only `failed` and `parked` keys can be retried or released, not `{}` ones",
            status_text(*status)
        )));
    }
    Ok(filter)
}

async fn change(
    idem: &Idem,
    filter: &KeyFilter,
    dry_run: bool,
    change: KeyChange,
) -> Result<Change, AdminError> {
    let filter = releasable(filter)?;
    let mut tx = idem.bounded_transaction().await?;
    let keys = idem
        .statements()
        .change_keys(&mut tx, &filter.selection(), change, dry_run)
        .await?;
    tx.commit().await?;
    if keys.is_empty()
        && let (Some(scope), Some(key)) = (&filter.scope, filter.key)
    {
        // One key asked for, and not changed: say why.
        let row = show_key(idem, scope, key).await?;
        if !matches!(row.status.as_str(), "failed" | "parked") {
            return Err(AdminError::WrongStatus {
                scope: row.scope,
                key: row.key,
                status: row.status,
            });
        }
    }
    Ok(Change { keys, dry_run })
}

/// Gives the selected `failed` and `parked` keys a fresh count of attempts (status
/// `failed`, attempts 0), so that the next delivery runs the body again, up to
/// `max_attempts` more times. The recorded error and payload fingerprint stay.
///
/// The filter may only select `failed` and `parked` keys (none given: both). One key
/// asked for by scope and key that is unknown or not failed or parked is an error
/// ([`AdminError::UnknownKey`], [`AdminError::WrongStatus`]).
pub async fn retry_keys(
    idem: &Idem,
    filter: &KeyFilter,
    dry_run: bool,
) -> Result<Change, AdminError> {
    change(idem, filter, dry_run, KeyChange::Retry).await
}

/// Deletes the selected `failed` and `parked` keys: the next delivery of their messages is
/// a first delivery, with any payload (the recorded fingerprint is deleted too).
///
/// Selection and errors as for [`retry_keys`].
pub async fn release_keys(
    idem: &Idem,
    filter: &KeyFilter,
    dry_run: bool,
) -> Result<Change, AdminError> {
    change(idem, filter, dry_run, KeyChange::Release).await
}

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

/// One key field value as a producer gives it: `name=value` (a string),
/// `name:type=value` with type `str`, `int`, `bool`, `uuid`, `date` (`YYYY-MM-DD`) or
/// `time` (RFC 3339), or a bare `value` (a string).
///
/// Only the values, their types and their order make the key (names are for reading):
/// give them in the order of the handler's `key = "..."`.
///
/// ```
/// use idem_runtime::admin::{KeyField, key_from_fields};
/// use idem_runtime::key::KeyBuilder;
///
/// let fields = ["order_id=order-1", "seq:int=42"].map(|f| KeyField::parse(f).unwrap());
/// let expected = KeyBuilder::new().part("order_id", "order-1")?.part("seq", &42_i64)?.finish();
/// assert_eq!(key_from_fields(&fields)?, expected);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct KeyField {
    /// The field's name, as given (not part of the key).
    pub name: String,
    /// The typed value.
    pub value: FieldValue,
}

/// A typed key field value (see [`KeyField`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FieldValue {
    /// A string (`str`, `String`, `char`, a unit enum deriving `KeyPart`: its variant's name).
    Str(String),
    /// An integer of any width.
    Int(i128),
    /// A boolean.
    Bool(bool),
    /// A UUID.
    Uuid(Uuid),
    /// A calendar date.
    Date(chrono::NaiveDate),
    /// An instant.
    Time(DateTime<chrono::FixedOffset>),
}

impl KeyField {
    /// Parses `name=value`, `name:type=value` or `value`.
    pub fn parse(text: &str) -> Result<Self, AdminError> {
        let (head, value) = match text.split_once('=') {
            Some((head, value)) => (head, value),
            None => ("", text),
        };
        let (name, kind) = head.split_once(':').unwrap_or((head, "str"));
        let invalid = |what: &str| AdminError::KeyField(format!("{text:?}: {what}"));
        let value = match kind {
            "str" | "string" => FieldValue::Str(value.to_owned()),
            "int" => FieldValue::Int(value.parse().map_err(|_| invalid("not an integer"))?),
            "bool" => FieldValue::Bool(value.parse().map_err(|_| invalid("not true or false"))?),
            "uuid" => FieldValue::Uuid(value.parse().map_err(|_| invalid("not a UUID"))?),
            "date" => FieldValue::Date(
                value
                    .parse()
                    .map_err(|_| invalid("not a date (YYYY-MM-DD)"))?,
            ),
            "time" => FieldValue::Time(
                DateTime::parse_from_rfc3339(value)
                    .map_err(|_| invalid("not an RFC 3339 instant"))?,
            ),
            other => {
                return Err(invalid(&format!(
                    "unknown type `{other}`: use str, int, bool, uuid, date or time"
                )));
            }
        };
        Ok(KeyField {
            name: name.to_owned(),
            value,
        })
    }
}

/// The key of `fields`, in order: what `#[idempotent(key = "...")]` derives from a message
/// with these values (see [`key`](crate::key)).
pub fn key_from_fields(fields: &[KeyField]) -> Result<IdempotencyKey, AdminError> {
    if fields.is_empty() {
        return Err(AdminError::KeyField("no field given".to_owned()));
    }
    let parts: Vec<&dyn KeyPart> = fields
        .iter()
        .map(|field| match &field.value {
            FieldValue::Str(value) => value as &dyn KeyPart,
            FieldValue::Int(value) => value,
            FieldValue::Bool(value) => value,
            FieldValue::Uuid(value) => value,
            FieldValue::Date(value) => value,
            FieldValue::Time(value) => value,
        })
        .collect();
    Ok(key_of(&parts)?)
}
