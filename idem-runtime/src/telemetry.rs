//! Metrics and tracing of each handling.
//!
//! idem reports through the [`metrics`] facade (install any recorder, e.g. a Prometheus
//! exporter; without one, nothing is recorded) and [`tracing`] spans. Labels have a low
//! cardinality: the scope, the mode and the outcome; never the key or the payload.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `idem_handlings_total` | counter | `scope`, `mode`, `outcome` | deliveries by outcome: `executed`, `duplicate`, `failed`, `parked`, `in_progress`, `mismatch`, `key_error`, `lease_lost`, `outside_window`, `transaction_ended`, `scope_conflict`, `key_changed`, `handler_moved`, `error` |
//! | `idem_attempts_charged_total` | counter | `scope` | failed attempts recorded against messages (each counts towards `max_attempts`); failures that are the infrastructure's are not charged |
//! | `idem_claim_duration_seconds` | histogram | `scope`, `mode` | the claim: from `BEGIN` to the decision (run the body, or not) |
//! | `idem_handler_duration_seconds` | histogram | `scope`, `mode` | the handler's body |
//! | `idem_cache_lookups_total` | counter | `result` | Redis look-ups: `hit`, `miss`, `error`, `skipped`, `forged` |
//! | `idem_cache_writes_total` | counter | `result` | Redis writes: `ok`, `error`, `skipped` |
//! | `idem_retention_deleted_total` | counter | `scope` | `success` keys deleted by the retention cleanup ([`retention`](crate::retention)) |
//! | `idem_time_buckets_created_total` | counter | | time buckets made ahead by the cleanup ([`time_buckets`](crate::time_buckets)) |
//! | `idem_time_buckets_dropped_total` | counter | | expired time buckets dropped by the cleanup |
//! | `idem_time_buckets` | gauge | `schema` | time buckets that exist, as the cleanup's last upkeep of them found them |
//! | `idem_time_buckets_oldest_start_timestamp_seconds` | gauge | `schema` | the start of the oldest bucket (Unix time): the oldest fact whose key is kept; `time() -` it is the age of the oldest retained fact hour |
//! | `idem_time_buckets_newest_end_timestamp_seconds` | gauge | `schema` | the end of the newest bucket (Unix time): how far ahead buckets are made; `-` `time()` it is how far ahead, negative when no bucket is made ahead (the upkeep stopped) |
//!
//! `mode` is `transaction`, `lease` or `batch` (a message handled by a batch, counted once
//! per message). Each handling runs in a span `idem.handle` with the fields `idem.scope`,
//! `idem.key`, `idem.mode`, `idem.outcome` and, where known, `idem.attempts`.

use std::time::Instant;

use tracing::Span;

use crate::key::IdempotencyKey;
use crate::outcome::{Error, Outcome};

/// The mode label of a handling.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    Transaction,
    Lease,
    Batch,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Transaction => "transaction",
            Mode::Lease => "lease",
            Mode::Batch => "batch",
        }
    }
}

/// The span of one handling (record its outcome with [`finish`]).
pub(crate) fn span(scope: &str, key: IdempotencyKey, mode: Mode) -> Span {
    tracing::info_span!(
        "idem.handle",
        idem.scope = scope,
        idem.key = %key,
        idem.mode = mode.label(),
        idem.outcome = tracing::field::Empty,
        idem.attempts = tracing::field::Empty,
    )
}

/// The outcome label of a handling's result.
pub(crate) fn outcome_label<T, E>(result: &Result<Outcome<T>, Error<E>>) -> &'static str {
    match result {
        Ok(Outcome::Executed(_)) => "executed",
        Ok(Outcome::Duplicate(_)) => "duplicate",
        Err(Error::Handler { parked: true, .. } | Error::Parked { .. }) => "parked",
        Err(Error::Handler { .. }) => "failed",
        Err(Error::InProgress { .. }) => "in_progress",
        Err(Error::PayloadMismatch { .. }) => "mismatch",
        Err(Error::Key(_)) => "key_error",
        Err(Error::OutsideWindow { .. }) => "outside_window",
        Err(Error::LeaseLost { .. }) => "lease_lost",
        Err(Error::TransactionEnded { .. }) => "transaction_ended",
        Err(Error::ScopeConflict(_)) => "scope_conflict",
        Err(Error::KeyChanged(_)) => "key_changed",
        Err(Error::HandlerMoved(_)) => "handler_moved",
        Err(_) => "error",
    }
}

/// Counts a handling's outcome and records it on `span`.
pub(crate) fn finish<T, E>(
    span: &Span,
    scope: &str,
    mode: Mode,
    result: &Result<Outcome<T>, Error<E>>,
) {
    let outcome = outcome_label(result);
    span.record("idem.outcome", outcome);
    if let Err(Error::Handler { attempts, .. } | Error::Parked { attempts, .. }) = result {
        span.record("idem.attempts", attempts);
    }
    count(scope, mode, outcome);
}

/// Counts one handling's outcome.
pub(crate) fn count(scope: &str, mode: Mode, outcome: &'static str) {
    metrics::counter!(
        "idem_handlings_total",
        "scope" => scope.to_owned(),
        "mode" => mode.label(),
        "outcome" => outcome,
    )
    .increment(1);
}

/// Times a phase of a handling: the claim or the handler's body.
pub(crate) struct Timer {
    started: Instant,
}

impl Timer {
    pub(crate) fn start() -> Self {
        Timer {
            started: Instant::now(),
        }
    }

    pub(crate) fn claim(self, scope: &str, mode: Mode) {
        self.record("idem_claim_duration_seconds", scope, mode);
    }

    pub(crate) fn handler(self, scope: &str, mode: Mode) {
        self.record("idem_handler_duration_seconds", scope, mode);
    }

    fn record(self, name: &'static str, scope: &str, mode: Mode) {
        metrics::histogram!(name, "scope" => scope.to_owned(), "mode" => mode.label())
            .record(self.started.elapsed().as_secs_f64());
    }
}

/// Counts a Redis cache look-up or write by its result.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn cache(name: &'static str, result: &'static str) {
    metrics::counter!(name, "result" => result).increment(1);
}

/// Counts the keys of `scope` that a retention batch deleted.
/// Counts a failed attempt recorded against a message of `scope`.
pub(crate) fn attempt_charged(scope: &str) {
    metrics::counter!("idem_attempts_charged_total", "scope" => scope.to_owned()).increment(1);
}

/// Counts the time buckets one upkeep made and dropped.
pub(crate) fn buckets(made: u64, dropped: u64) {
    metrics::counter!("idem_time_buckets_created_total").increment(made);
    metrics::counter!("idem_time_buckets_dropped_total").increment(dropped);
}

/// The time buckets of `schema` as an upkeep left them: how many, the start of the oldest
/// and the end of the newest (the gauges stay as they are while there is none).
pub(crate) fn bucket_span(
    schema: &str,
    buckets: i64,
    oldest: Option<chrono::DateTime<chrono::Utc>>,
    newest_end: Option<chrono::DateTime<chrono::Utc>>,
) {
    let seconds = |at: chrono::DateTime<chrono::Utc>| at.timestamp_micros() as f64 / 1e6;
    metrics::gauge!("idem_time_buckets", "schema" => schema.to_owned()).set(buckets as f64);
    if let Some(oldest) = oldest {
        metrics::gauge!(
            "idem_time_buckets_oldest_start_timestamp_seconds",
            "schema" => schema.to_owned()
        )
        .set(seconds(oldest));
    }
    if let Some(newest_end) = newest_end {
        metrics::gauge!(
            "idem_time_buckets_newest_end_timestamp_seconds",
            "schema" => schema.to_owned()
        )
        .set(seconds(newest_end));
    }
}

pub(crate) fn retention_deleted(scope: &str, deleted: u64) {
    metrics::counter!("idem_retention_deleted_total", "scope" => scope.to_owned())
        .increment(deleted);
}
