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
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};
use uuid::Uuid;

use crate::key::{IdempotencyKey, KeyError, KeyPart, key_of};
use crate::store::{Status, Value};
use crate::{Idem, MIGRATOR};

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

/// A row of the status table, for operators: everything but the stored result's bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KeyRow {
    /// The handler's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: Uuid,
    /// `processing`, `success`, `failed` or `parked`.
    pub status: String,
    /// Executions of the body (failed ones, plus the successful one).
    pub attempts: i32,
    /// The payload fingerprint (SHA-256, hex), when the handler declares one.
    pub fingerprint: Option<String>,
    /// The stored result (JSON), when the handler stores one.
    pub result: Option<serde_json::Value>,
    /// The last recorded error.
    pub last_error: Option<String>,
    /// Lease mode: the worker holding the lease.
    pub lease_owner: Option<Uuid>,
    /// Lease mode: when the lease expires (database clock).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the key was first recorded.
    pub created_at: DateTime<Utc>,
    /// When the key last changed.
    pub updated_at: DateTime<Utc>,
}

impl<'r> FromRow<'r, PgRow> for KeyRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(KeyRow {
            scope: row.try_get("scope")?,
            key: row.try_get("key")?,
            status: row.try_get("status")?,
            attempts: row.try_get("attempts")?,
            fingerprint: row
                .try_get::<Option<Vec<u8>>, _>("fingerprint")?
                .map(hex::encode),
            result: row.try_get("result")?,
            last_error: row.try_get("last_error")?,
            lease_owner: row.try_get("lease_owner")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

const COLUMNS: &str = "scope, key, status, attempts, fingerprint, result, last_error, \
                       lease_owner, lease_expires_at, created_at, updated_at";

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
    let schema = idem.config().schema().as_str();
    let statements = idem.statements();
    let tracked: Option<String> = statements
        .query(
            "SELECT to_regclass(format('%I._sqlx_migrations', $1::text))::text",
            &[schema.into()],
        )
        .fetch_one(idem.pool())
        .await?
        .try_get(0)?;
    let applied: Vec<i64> = match tracked {
        Some(table) => statements
            .query(&format!("SELECT version FROM {table} WHERE success"), &[])
            .fetch_all(idem.pool())
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
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
    let statement = format!(
        "SELECT {COLUMNS} FROM {} WHERE scope = $1 AND key = $2",
        idem.statements().table
    );
    idem.statements()
        .query(&statement, &[scope.into(), key.into()])
        .fetch_optional_as(idem.pool())
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

    /// The `WHERE` clause over `$1` scope, `$2` key, `$3` statuses, `$4` age in ms.
    fn clause(&self) -> &'static str {
        "($1::text IS NULL OR scope = $1) \
         AND ($2::uuid IS NULL OR key = $2) \
         AND (cardinality($3::text[]) = 0 OR status = ANY($3)) \
         AND ($4::bigint IS NULL OR updated_at < now() - $4 * interval '1 millisecond')"
    }

    fn statuses(&self) -> Vec<String> {
        self.statuses
            .iter()
            .map(|status| status_text(*status).to_owned())
            .collect()
    }

    /// The values of the filter's clause's parameters `$1` to `$4`; `statuses` is
    /// [`statuses`](Self::statuses).
    fn values<'a>(&'a self, statuses: &'a [String]) -> [Value<'a>; 4] {
        [
            self.scope.as_deref().into(),
            self.key.into(),
            statuses.into(),
            self.age_ms().into(),
        ]
    }

    fn age_ms(&self) -> Option<i64> {
        self.older_than
            .map(|age| i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A status as the status table writes it.
pub fn status_text(status: Status) -> &'static str {
    match status {
        Status::Processing => "processing",
        Status::Success => "success",
        Status::Failed => "failed",
        Status::Parked => "parked",
    }
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
    let statement = format!(
        "SELECT {COLUMNS} FROM {} WHERE {} \
         AND ($5::text IS NULL OR (scope, key) > ($5, $6::uuid)) \
         ORDER BY scope, key LIMIT $7",
        idem.statements().table,
        filter.clause()
    );
    let statuses = filter.statuses();
    Ok(idem
        .statements()
        .query(
            &statement,
            &[
                &filter.values(&statuses)[..],
                &[
                    after.map(|cursor| cursor.scope.as_str()).into(),
                    after.map(|cursor| cursor.key).into(),
                    i64::from(limit).into(),
                ],
            ]
            .concat(),
        )
        .fetch_all_as(idem.pool())
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
    write: &str,
) -> Result<Change, AdminError> {
    let filter = releasable(filter)?;
    let table = &idem.statements().table;
    // The rows as they are, locked (`SKIP LOCKED`: a key that a delivery is retrying
    // right now is left to it), then changed in the same statement.
    let statement = format!(
        "WITH chosen AS ( \
            SELECT {COLUMNS} FROM {table} WHERE {} \
            ORDER BY scope, key FOR UPDATE SKIP LOCKED), \
         changed AS ({write} chosen WHERE k.scope = chosen.scope AND k.key = chosen.key \
                     AND k.status IN ('failed', 'parked') AND NOT $5 RETURNING k.scope, k.key) \
         SELECT chosen.* FROM chosen \
         WHERE $5 OR EXISTS (SELECT FROM changed \
                             WHERE changed.scope = chosen.scope AND changed.key = chosen.key) \
         ORDER BY scope, key",
        filter.clause()
    );
    let mut tx = idem.bounded_transaction().await?;
    let statuses = filter.statuses();
    let keys: Vec<KeyRow> = idem
        .statements()
        .query(
            &statement,
            &[&filter.values(&statuses)[..], &[dry_run.into()]].concat(),
        )
        .fetch_all_as(&mut *tx)
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
    let table = &idem.statements().table;
    let write =
        format!("UPDATE {table} AS k SET status = 'failed', attempts = 0, updated_at = now() FROM");
    change(idem, filter, dry_run, &write).await
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
    let table = &idem.statements().table;
    change(
        idem,
        filter,
        dry_run,
        &format!("DELETE FROM {table} AS k USING"),
    )
    .await
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
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
    let table = &idem.statements().table;
    let statements = idem.statements();
    let counts: Vec<(String, String, i64, DateTime<Utc>)> = statements
        .query(
            &format!(
                "SELECT scope, status, count(*), min(updated_at) FROM {table} \
                 GROUP BY scope, status ORDER BY scope, status"
            ),
            &[],
        )
        .fetch_all_as(idem.pool())
        .await?;
    let oldest_lease: Option<OldestLease> = statements
        .query(
            &format!(
                "SELECT scope, key, updated_at AS since, lease_expires_at AS expires_at, \
                        coalesce(lease_expires_at <= now(), false) AS expired \
                 FROM {table} WHERE status = 'processing' ORDER BY updated_at LIMIT 1"
            ),
            &[],
        )
        .fetch_optional_as(idem.pool())
        .await?;
    let table_bytes: i64 = statements
        .query(
            "SELECT pg_total_relation_size($1::regclass)",
            &[table.into()],
        )
        .fetch_one(idem.pool())
        .await?
        .try_get(0)?;
    let windows: Vec<ScopeWindow> = statements
        .query(
            &format!(
                "SELECT scope, retention_ms FROM {} WHERE retention_ms IS NOT NULL ORDER BY scope",
                statements.scopes_table
            ),
            &[],
        )
        .fetch_all_as(idem.pool())
        .await?;
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
