//! The status table and the other tables of idem's schema: the only code that writes SQL
//! on them. Each part of the runtime reads and writes them through the methods of
//! [`Statements`], grouped by who calls them: a delivery in transaction mode
//! (`delivery`), lease mode (`lease`), batches (`batch`), the scope registry and the
//! cache's namespace (`scopes`), the operator API (`admin`), the retention cleanup
//! (`retention`), and the migrations (`migrate`). [`sql`] sends each statement prepared,
//! or inlined behind a transaction pooler.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};

use crate::config::{Config, Pooler};
use crate::key::IdempotencyKey;

mod admin;
mod batch;
mod delivery;
mod grants;
mod lease;
mod migrate;
mod retention;
mod scopes;
mod sql;
#[cfg(feature = "testing")]
mod testing;
mod timed;

pub(crate) use admin::KeyChange;
pub use admin::{BucketRange, KeyFilter, KeyRow, StatusCount, TimeBucket};
pub(crate) use delivery::{Claim, ClaimedKey, KeyAt};
pub(crate) use grants::consumer_grants;
pub(crate) use lease::{LeaseClaim, LeaseKey};
pub use migrate::{MIGRATOR, migrate_schema};
pub(crate) use retention::Windows;
pub use scopes::ScopeInfo;
pub(crate) use scopes::{DefinitionChange, MovedFrom, ScopeRegistration, ScopeRow};
pub(crate) use timed::{Bucket, FactWindow};

use sql::{Protocol, Query, Value};

/// The status of a key in the status table.
///
/// Written and parsed as the status table stores it (`processing`, `success`, `failed`,
/// `parked`):
///
/// ```
/// use idem_runtime::Status;
///
/// assert_eq!("parked".parse::<Status>(), Ok(Status::Parked));
/// assert_eq!(Status::Success.to_string(), "success");
/// assert!("done".parse::<Status>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Lease mode: a worker holds the key until its lease expires.
    Processing,
    /// The handler succeeded; the key is final.
    Success,
    /// The last attempt failed; the next delivery retries.
    Failed,
    /// `max_attempts` attempts failed; no retry until [`Idem::reset`](crate::Idem::reset).
    Parked,
}

impl Status {
    /// The status as the status table writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "processing",
            Status::Success => "success",
            Status::Failed => "failed",
            Status::Parked => "parked",
        }
    }

    pub(crate) fn parse(text: &str) -> Result<Self, sqlx::Error> {
        text.parse()
            .map_err(|error: UnknownStatus| sqlx::Error::Decode(error.to_string().into()))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "processing" => Ok(Status::Processing),
            "success" => Ok(Status::Success),
            "failed" => Ok(Status::Failed),
            "parked" => Ok(Status::Parked),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// A text that names no [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}: the statuses are processing, success, failed and parked")]
pub struct UnknownStatus(String);

/// A row of the status table, as [`Idem::record`](crate::Idem::record) returns it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KeyRecord {
    /// The handler's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: IdempotencyKey,
    /// Where the key stands.
    pub status: Status,
    /// Executions of the body (failed ones, plus the successful one).
    pub attempts: u32,
    /// The last recorded error text.
    pub last_error: Option<String>,
    /// The stored result (JSON).
    pub result: Option<serde_json::Value>,
    /// The payload fingerprint recorded with the key (SHA-256), if its handler declares
    /// `fingerprint` fields: what [`HandlerKey::fingerprint_differs`](crate::HandlerKey::fingerprint_differs)
    /// compares a message's with.
    pub fingerprint: Option<Vec<u8>>,
    /// When the key was first recorded.
    pub created_at: DateTime<Utc>,
    /// When the key last changed.
    pub updated_at: DateTime<Utc>,
}

impl<'r> FromRow<'r, PgRow> for KeyRecord {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(KeyRecord {
            scope: row.try_get("scope")?,
            key: IdempotencyKey::from_uuid(row.try_get("key")?),
            status: Status::parse(row.try_get("status")?)?,
            attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
            last_error: row.try_get("last_error")?,
            result: row.try_get("result")?,
            fingerprint: row.try_get("fingerprint")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

/// The existing row that a claim ran into.
#[derive(Debug)]
pub(crate) struct Existing {
    pub status: Status,
    pub attempts: u32,
    pub fingerprint: Option<Vec<u8>>,
    pub result: Option<serde_json::Value>,
    pub last_error: Option<String>,
}

fn existing(row: &PgRow) -> Result<Existing, sqlx::Error> {
    Ok(Existing {
        status: Status::parse(row.try_get("status")?)?,
        attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
        fingerprint: row.try_get("fingerprint")?,
        result: row.try_get("result")?,
        last_error: row.try_get("last_error")?,
    })
}

/// The attempts and whether the key is now parked, from a statement recording a failure.
fn failure_recorded(row: &PgRow) -> Result<(u32, bool), sqlx::Error> {
    let attempts = u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0);
    let parked = row.try_get::<&str, _>("status")? == "parked";
    Ok((attempts, parked))
}

/// `max_attempts` as the `integer` the statements compare attempts with.
fn attempts_value(max_attempts: u32) -> Value<'static> {
    Value::Int4(i32::try_from(max_attempts).unwrap_or(i32::MAX))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The SQL of one configured status table, built once per runtime handle.
#[derive(Debug)]
pub(crate) struct Statements {
    /// How the statements travel: prepared, or inlined behind a transaction pooler.
    protocol: Protocol,
    /// Opens a transaction whose lock waits are bounded by the lock timeout.
    pub(crate) begin: String,
    /// The lock timeout of `begin`, as `set_config` takes it: what a claim followed by
    /// another claim keeps.
    claim_lock_timeout: String,
    /// The status table, `<schema>.idem_keys`.
    table: String,
    /// The scope registry, `<schema>.idem_scopes`.
    scopes_table: String,
    delivery: delivery::Sql,
    timed: timed::Sql,
    lease: lease::Sql,
    batch: batch::Sql,
    scopes: scopes::Sql,
    retention: retention::Sql,
}

impl Statements {
    pub(crate) fn new(config: &Config) -> Self {
        let schema = &config.schema;
        let table = format!("{schema}.idem_keys");
        let scopes_table = format!("{schema}.idem_scopes");
        let lock_timeout_ms = config.lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        Statements {
            protocol: match config.pooler {
                Pooler::Session => Protocol::Prepared,
                Pooler::Transaction => Protocol::Inline,
            },
            // One round trip: open the transaction and bound its lock waits: the claim's
            // wait behind an in-flight claim of the same key. A claim that wins sets the
            // session's own lock timeout back for the body (`$4` of the claim statements).
            begin: format!("BEGIN; SET LOCAL lock_timeout = '{lock_timeout_ms}ms'"),
            claim_lock_timeout: format!("{lock_timeout_ms}ms"),
            delivery: delivery::Sql::new(&table, &format!("{schema}.idem_timed_keys")),
            timed: timed::Sql::new(schema.as_str()),
            lease: lease::Sql::new(&table, &format!("{schema}.idem_timed_keys")),
            batch: batch::Sql::new(&table),
            scopes: scopes::Sql::new(schema),
            retention: retention::Sql::new(&table, &scopes_table, schema.as_str()),
            table,
            scopes_table,
        }
    }

    /// The claim's lock timeout, for a claim that another claim follows in its
    /// transaction.
    pub(crate) fn claim_lock_timeout(&self) -> &str {
        &self.claim_lock_timeout
    }

    /// `sql` with `values` for its parameters, as this handle sends statements.
    fn query<'q>(&self, sql: &'q str, values: &[Value<'_>]) -> Query<'q> {
        self.protocol.query(sql, values)
    }
}
