//! What a call of an idempotent handler returns.

use std::error::Error as StdError;

use chrono::{DateTime, Utc};

use crate::key::{IdempotencyKey, KeyError};

/// The successful result of delivering a message to an idempotent handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The body ran and its effects are committed together with the key's `success`.
    Executed(T),
    /// The key had already succeeded: the body did not run.
    ///
    /// Carries the result stored by the execution that succeeded, or `None` where the
    /// handler stores none (`store_result = false`).
    Duplicate(Option<T>),
}

impl<T> Outcome<T> {
    /// Whether this delivery ran the body.
    pub fn is_executed(&self) -> bool {
        matches!(self, Outcome::Executed(_))
    }

    /// Whether this delivery was a duplicate of a key that had already succeeded.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }

    /// The handler's value: fresh, or replayed from the status table.
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::Executed(value) => Some(value),
            Outcome::Duplicate(value) => value,
        }
    }
}

/// The side of its window that a fact's time is on ([`Error::OutsideWindow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowEdge {
    /// Older than the scope's retention window, or in a time bucket that the retention
    /// cleanup has dropped (one older than the longest window the cleaner knew).
    Past,
    /// Further ahead of the database clock than the future bound.
    Future,
}

/// What a consumer should do with a message whose delivery returned an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Deliver it again later: the failure is recorded or transient, and a retry can succeed.
    Retry,
    /// Retrying cannot help (bad key, mismatched payload, parked key): move it aside, for
    /// example to a dead-letter table, and go on.
    DeadLetter,
    /// The deployment is wrong (two handlers share a scope by accident): no message of
    /// this handler can be processed safely. Stop consuming and alert; neither retry nor
    /// dead-letter the message.
    Halt,
}

/// Why a delivery did not end in an [`Outcome`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The handler returned an error. Its effects were rolled back and the failure was
    /// recorded (`failed`, the error text, the attempt count); the next delivery retries.
    #[error("handler failed (attempt {attempts}): {source}")]
    Handler {
        /// The handler's error.
        source: E,
        /// Failed attempts recorded for the key, this one included (0 if recording failed).
        attempts: u32,
        /// Whether this failure used up `max_attempts` and parked the key.
        parked: bool,
    },
    /// The key has failed `max_attempts` times and is parked: the body no longer runs
    /// until the key is reset with [`Idem::reset`](crate::Idem::reset).
    #[error("key {key} is parked after {attempts} failed attempts; last error: {last_error}")]
    Parked {
        /// The parked key.
        key: IdempotencyKey,
        /// Failed attempts recorded.
        attempts: u32,
        /// The last recorded error text.
        last_error: String,
    },
    /// Another delivery of the key is being processed (its claim is held longer than the
    /// lock timeout, or its lease is live). Retry later.
    #[error("key {key} is being processed by another delivery")]
    InProgress {
        /// The contended key.
        key: IdempotencyKey,
    },
    /// The key was seen before with a different payload fingerprint: two different facts
    /// derived the same key, or a producer reused a key. The body did not run.
    #[error("key {key} was first recorded with a different payload")]
    PayloadMismatch {
        /// The key.
        key: IdempotencyKey,
    },
    /// Lease mode: this worker's lease expired and another worker claimed the key before
    /// this one completed; its outcome was not recorded. The effect may have run twice,
    /// which is what the lease's fencing token is for.
    #[error(
        "the lease on key {key} was lost before the handler completed; its outcome was not recorded"
    )]
    LeaseLost {
        /// The key.
        key: IdempotencyKey,
    },
    /// The key could not be derived from the message.
    #[error("cannot derive the idempotency key: {0}")]
    Key(#[from] KeyError),
    /// The handler keeps its keys by the fact's time (`event_time`), and this fact's time
    /// is outside its scope's window: older than the retention window (its key may have
    /// expired with its time bucket, so running it could apply the fact twice), or
    /// further ahead of the database clock than the future bound (a producer's clock or
    /// stamp is wrong). Nothing was claimed or run; a consumer dead-letters the message.
    /// See [`time_buckets`](crate::time_buckets).
    #[error("key {key}: {}", match edge {
        WindowEdge::Past => format!("the fact happened at {fact_time}, before its scope's retention window or in a time bucket that the retention cleanup already dropped (a cleaner drops the buckets older than the longest window it knows: its own and those the handlers declare with `retention`); its key may have expired with its bucket, so it is not run (it could apply the fact twice): redrive it on purpose as a new fact, or declare the scope's window on the handler"),
        WindowEdge::Future => format!("the fact is stamped {fact_time}, further ahead of the database clock than the future bound allows; it is not run: check the producer's clock and stamps, or raise `Retention::future_bound`"),
    })]
    OutsideWindow {
        /// The key.
        key: IdempotencyKey,
        /// The fact's time, as the handler's `event_time` field gave it.
        fact_time: DateTime<Utc>,
        /// Which side of the window it is on.
        edge: WindowEdge,
    },
    /// The stored result of a duplicate could not be read back as the handler's type.
    #[error(
        "the stored result of key {key} does not decode as the handler's result type: {source}"
    )]
    StoredResult {
        /// The key.
        key: IdempotencyKey,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// The handler's result could not be encoded for storage.
    #[error("the handler's result cannot be stored: {0}")]
    ResultEncoding(serde_json::Error),
    /// PostgreSQL failed (connection lost, commit failed, ...). Whether a commit that
    /// failed took effect is unknown; the next delivery finds out through the status table.
    /// A failure that PostgreSQL reported about the handler's own transaction (a deferred
    /// constraint, an aborted transaction) is recorded as a failed attempt, so that a
    /// message that can never commit is parked after `max_attempts`.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The handler's body ended the transaction that holds its key: it ran `COMMIT` or
    /// `ROLLBACK` itself, or began a transaction of its own on the connection
    /// (`tx.begin()`), whose commit or rollback ended idem's. The claim and the effects no
    /// longer commit together. The key is parked; fix the handler (a part of the body that
    /// may fail on its own takes `SAVEPOINT` and `ROLLBACK TO SAVEPOINT` statements), then
    /// [`Idem::reset`](crate::Idem::reset) the key.
    #[error(
        "the body of the handler of key {key} ended the transaction that holds the key (it ran COMMIT or ROLLBACK, or began and ended a transaction of its own with tx.begin(); use SAVEPOINT statements instead); the key is parked"
    )]
    TransactionEnded {
        /// The key.
        key: IdempotencyKey,
    },
    /// Two handlers use one scope without declaring it shared: their keys would answer
    /// each other's messages. Nothing was claimed or run. Give one of them its own
    /// `scope`, or declare `shared_scope = true` on both when that is intended.
    #[error("scope conflict: {0}")]
    ScopeConflict(#[source] ScopeConflict),
    /// The handler derives its keys otherwise than its scope's keys were derived (a key
    /// field added, removed, reordered, renamed or of a type that encodes otherwise; the
    /// payload fingerprint's fields changed): every fact delivered again would run again.
    /// Refused at the handler's first delivery, before anything was claimed; the message
    /// names both definitions and the ways out (see [`KeyChanged`]).
    #[error("key definition changed: {0}")]
    KeyChanged(#[source] KeyChanged),
    /// A handler without `scope` finds no keys under its default scope, while a scope of
    /// its crate with the same message type or key has keys and no handler in the
    /// binary: it is that scope's handler renamed or moved, and would run every fact
    /// again. Nothing was claimed or run; the message names the old scope and the fix
    /// (see [`HandlerMoved`]).
    #[error("handler moved: {0}")]
    HandlerMoved(#[source] HandlerMoved),
}

impl<E> Error<E> {
    /// What a consumer should do with the message.
    pub fn disposition(&self) -> Disposition {
        match self {
            Error::Handler { parked: true, .. }
            | Error::Parked { .. }
            | Error::PayloadMismatch { .. }
            | Error::Key(_)
            | Error::StoredResult { .. }
            | Error::ResultEncoding(_)
            | Error::TransactionEnded { .. }
            | Error::OutsideWindow { .. } => Disposition::DeadLetter,
            Error::ScopeConflict(_) | Error::KeyChanged(_) | Error::HandlerMoved(_) => {
                Disposition::Halt
            }
            Error::Handler { parked: false, .. }
            | Error::InProgress { .. }
            | Error::LeaseLost { .. }
            | Error::Database(_) => Disposition::Retry,
        }
    }
}

impl<E> From<sqlx::Error> for Error<E> {
    fn from(error: sqlx::Error) -> Self {
        Error::Database(error)
    }
}

/// Two handlers would share a scope without declaring it (see [`scope`](crate::scope)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ScopeConflict {
    scope: String,
    message: String,
}

impl ScopeConflict {
    pub(crate) fn new(scope: &str, message: String) -> Self {
        ScopeConflict {
            scope: scope.to_owned(),
            message,
        }
    }

    /// The scope both handlers use.
    pub fn scope(&self) -> &str {
        &self.scope
    }
}

/// A handler's key definition differs from the one its scope recorded (see
/// [`Error::KeyChanged`] and [`scope`](crate::scope)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct KeyChanged {
    scope: String,
    recorded: String,
    current: String,
    message: String,
}

impl KeyChanged {
    pub(crate) fn new(scope: &str, recorded: &str, current: &str, message: String) -> Self {
        KeyChanged {
            scope: scope.to_owned(),
            recorded: recorded.to_owned(),
            current: current.to_owned(),
            message,
        }
    }

    /// The handler's scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The definition the scope's keys were derived with, as recorded
    /// (`idem:v1 key(order_id s) ...`).
    pub fn recorded(&self) -> &str {
        &self.recorded
    }

    /// The definition this build of the handler derives its keys with.
    pub fn current(&self) -> &str {
        &self.current
    }
}

/// A handler without `scope` was renamed or moved away from the scope that holds its keys
/// (see [`Error::HandlerMoved`] and [`scope`](crate::scope)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerMoved {
    scope: String,
    previous_scope: String,
    message: String,
}

impl HandlerMoved {
    pub(crate) fn new(scope: &str, previous_scope: &str, message: String) -> Self {
        HandlerMoved {
            scope: scope.to_owned(),
            previous_scope: previous_scope.to_owned(),
            message,
        }
    }

    /// The handler's default scope in this build.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The scope that holds its keys: `#[idempotent(scope = "<this>")]` keeps them.
    pub fn previous_scope(&self) -> &str {
        &self.previous_scope
    }
}

/// The return type of a handler rewritten by `#[idempotent]`, for a handler declared to
/// return `R = Result<T, E>`: `Result<Outcome<T>, Error<E>>`.
pub type Handled<R> =
    Result<Outcome<<R as HandlerResult>::Value>, Error<<R as HandlerResult>::Error>>;

/// The return type of an `#[idempotent]` handler body: a `Result`.
#[diagnostic::on_unimplemented(
    message = "an #[idempotent] handler must return a `Result`, not `{Self}`",
    label = "the body's error decides between committing and recording a failure",
    note = "declare the handler as `-> Result<T, E>`, with `E: std::error::Error`"
)]
pub trait HandlerResult {
    /// The value of a successful body.
    type Value;
    /// The error of a failed body.
    type Error;
}

impl<T, E> HandlerResult for Result<T, E> {
    type Value = T;
    type Error = E;
}

/// The error of an `#[idempotent]` handler body.
///
/// Implemented for every `std::error::Error + 'static` (a `thiserror` enum, `sqlx::Error`,
/// `std::io::Error`, ...). The runtime records its text, with its sources, as the key's
/// `last_error`, and retries the body when a source is a PostgreSQL serialization failure
/// or deadlock.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of an #[idempotent] handler",
    label = "the handler's error type must implement `std::error::Error + 'static`",
    note = "derive it with `thiserror`; a `Box<dyn Error>` or `anyhow::Error` can be wrapped in a newtype that implements `std::error::Error`"
)]
pub trait HandlerError {
    /// The error as a `std::error::Error`, to walk its sources.
    fn as_std_error(&self) -> &(dyn StdError + 'static);
}

// Errors name `HandlerError` and its hint, also for types such as `Box<dyn Error>`.
#[diagnostic::do_not_recommend]
impl<E: StdError + 'static> HandlerError for E {
    fn as_std_error(&self) -> &(dyn StdError + 'static) {
        self
    }
}
