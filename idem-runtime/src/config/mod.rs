//! Runtime settings and the validation of configured SQL identifiers.

use std::fmt;
use std::time::Duration;

pub(crate) mod retention;

/// A configuration value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A schema name that is not a plain SQL identifier.
    #[error(
        "invalid schema name {0:?}: use 1 to 48 characters of lowercase ASCII letters, digits and `_`, starting with a letter or `_`"
    )]
    InvalidIdentifier(String),
    /// `max_attempts` of zero.
    #[error("max_attempts must be at least 1")]
    ZeroAttempts,
}

/// A lowercase SQL identifier, safe to interpolate into statements without quoting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identifier(String);

impl Identifier {
    /// Validates `name`: 1 to 48 characters of `[a-z0-9_]`, not starting with a digit.
    ///
    /// ```
    /// use idem_runtime::config::Identifier;
    /// assert!(Identifier::new("idem").is_ok());
    /// assert!(Identifier::new("idem; drop table orders").is_err());
    /// assert!(Identifier::new("Idem").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let valid_start = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let valid_rest = name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if valid_start && valid_rest && name.len() <= 48 {
            Ok(Self(name.to_owned()))
        } else {
            Err(ConfigError::InvalidIdentifier(name.to_owned()))
        }
    }

    /// The identifier as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Settings of an [`Idem`](crate::Idem) runtime handle.
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) schema: Identifier,
    pub(crate) max_attempts: u32,
    pub(crate) lock_timeout: Duration,
    pub(crate) transient_retries: u32,
    pub(crate) error_texts: ErrorTexts,
    pub(crate) retention: retention::Retention,
    pub(crate) pooler: Pooler,
}

/// What stands between the handle's pool and PostgreSQL: see
/// [`IdemBuilder::pooler`](crate::IdemBuilder::pooler).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// A direct connection, or a pooler in session pooling (PgBouncer's
    /// `pool_mode = session`): each connection of the pool keeps one server session
    /// while it lives (the default).
    #[default]
    Session,
    /// A pooler in transaction pooling (PgBouncer's `pool_mode = transaction`, RDS Proxy,
    /// Supavisor's transaction mode, pgcat): each transaction may run on another server
    /// session. idem then prepares no statement (it sends simple queries), keeps nothing in
    /// the session between transactions (its locks are transaction-scoped), and closes,
    /// before a handler's transaction ends, the statements that sqlx prepared and cached in
    /// it. Works with PgBouncer 1.18 and later, with or without `max_prepared_statements`.
    Transaction,
}

/// What is stored of a failure in the status table's `last_error` (and shown to
/// operators): error texts can carry personal data from a handler's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ErrorTexts {
    /// The error and its sources as they display, NUL characters replaced, at most 2 KiB
    /// (the default).
    #[default]
    Full,
    /// Only the error's kind: its type's name (and the SQLSTATE of a database error), never
    /// its text.
    KindOnly,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            schema: Identifier("idem".to_owned()),
            max_attempts: 5,
            lock_timeout: Duration::from_secs(5),
            transient_retries: 3,
            error_texts: ErrorTexts::Full,
            retention: retention::Retention::default(),
            pooler: Pooler::Session,
        }
    }
}

impl Config {
    /// The schema holding the status table `idem_keys` (default `idem`).
    pub fn schema(&self) -> &Identifier {
        &self.schema
    }

    /// Failed attempts after which a key is parked (default 5).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How long a duplicate waits behind an in-flight claim before it is told
    /// "in progress" (default 5 s).
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// How often a serialization failure or deadlock is retried (default 3).
    pub fn transient_retries(&self) -> u32 {
        self.transient_retries
    }

    /// What is stored of a failure (default: the full text, bounded).
    pub fn error_texts(&self) -> ErrorTexts {
        self.error_texts
    }

    /// How long `success` keys are kept, and how the cleanup deletes them (default: 7
    /// days; the cleanup only runs when called, see [`retention`](crate::retention)).
    pub fn retention(&self) -> &retention::Retention {
        &self.retention
    }

    /// What stands between the pool and PostgreSQL (default: nothing, or a session pooler).
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }
}
